"""The ledger and admin endpoints under ``/v1``. Each handler is one engine call."""

import functools
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from quota_ledger.engine import QuotaEngine
from quota_ledger.http import (
    config_models,
    config_views,
    dry_run,
    ledger_ops,
    long_poll,
    models,
    reservation_list,
    scoped,
)
from quota_ledger.http.auth import Authenticator, check_scope
from quota_ledger.http.metrics import Metrics
from quota_ledger.model import history, queues, short_ids, validation
from quota_ledger.model.errors import IdempotencyConflict, ReservationNotFound
from quota_ledger.model.values import ReservationState
from quota_ledger.runtime import overview
from quota_ledger.runtime.tokens import Token

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": models.ErrorOut, "description": text}
    for code, text in (
        (401, "no or unknown token"),
        (403, "wrong role or outside the token's partition and queue"),
        (404, "not found"),
        (409, "over quota, wrong state or idempotency conflict"),
        (413, "body over 1 MiB"),
        (422, "invalid request, naming the field"),
        (503, "database unavailable (Retry-After)"),
    )
}


def build(engine: QuotaEngine, auth: Authenticator, metrics: Metrics) -> APIRouter:
    router = APIRouter(prefix="/v1", responses=ERRORS)
    reader = Depends(auth.require("reader"))
    service = Depends(auth.require("service"))
    admin = Depends(auth.require("admin"))

    # -- reservations ------------------------------------------------------------------------
    # The hot routes answer with the body's bytes (a Response): FastAPI then neither validates
    # nor serializes the returned value again; ``response_model`` still documents it.
    ops = ledger_ops.LedgerOps(engine, metrics)

    @router.post("/reservations", status_code=201, response_model=models.ReservationOut, tags=["ledger"])
    def reserve(
        body: models.ReserveBody,
        token: Annotated[Token, service],
        idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
        dry: Annotated[Literal["All"] | None, Query(alias="dryRun")] = None,
    ) -> Response:
        """Reserve resources in a queue (all or nothing), or what a Kubernetes Pod needs.

        With ``?dryRun=All`` nothing is written: the answer is the decision the request would
        get now (201, or 409 over a limit) with its explanation: every limit that stops it and
        the largest holders of what each counts."""
        key = body.key if body.key is not None else idempotency_key
        if dry is not None:
            return dry_run.explain(engine, body, token, key)
        if body.wait is not None:
            made = ops.reserve_or_wait(body, token, key)
            if made.state is ReservationState.WAITING:
                response = ledger_ops.reservation_response(made, 202)
                response.headers["Location"] = f"/v1/reservations/{made.id}"
                return response
            return ledger_ops.reservation_response(made, 201)
        return ledger_ops.reservation_response(ops.reserve(body, token, key), 201)

    @router.get(
        "/reservations",
        response_model=models.ReservationOut | models.ReservationListOut,
        tags=["ledger"],
    )
    def find_reservations(
        token: Annotated[Token, reader],
        listed: Annotated[reservation_list.Filters, Depends(reservation_list.filters)],
        key: Annotated[str | None, Query(max_length=255)] = None,
        partition: Annotated[str, Query(max_length=64)] = "default",
    ) -> models.ReservationOut | models.ReservationListOut:
        """With ``key``: the reservation made with this idempotency key (a pod's uid for
        ``reserve_pod``). Without: ``{"reservations": [...], "more"}``, the partition's
        reservations that match the filters, oldest first, at most ``limit``."""
        if key is None:
            return reservation_list.answer(engine, token, partition, listed)
        return models.ReservationOut.of(ops.by_key(key, token, partition))

    @router.get("/reservation-ids", response_model=list[str], tags=["ledger"])
    def reservation_ids(
        token: Annotated[Token, reader],
        prefix: Annotated[
            str, Query(min_length=short_ids.MIN_PREFIX, max_length=36, pattern=f"^{short_ids.PREFIX}$")
        ],
        limit: Annotated[int, Query(ge=1, le=100)] = short_ids.SHOWN_CANDIDATES + 1,
    ) -> list[str]:
        """Ids of reservations that start with ``prefix`` (for short ids, as git's short hashes);
        a restricted token sees only those in its partition and queue."""
        found = overview.reservation_ids(engine, prefix, limit)
        if token.partition is None and token.queue is None:
            return found
        mine = [engine.get(rid) for rid in found]
        return [r.id for r in mine if token.covers(r.partition, r.queue)]

    @router.get("/reservations/{reservation_id}", response_model=models.ReservationOut, tags=["ledger"])
    async def get_reservation(
        reservation_id: str,
        token: Annotated[Token, reader],
        wait: Annotated[float | None, Query(gt=0, le=long_poll.MAX_WAIT)] = None,
    ) -> models.ReservationOut:
        """The reservation as stored now. With ``wait`` (seconds, at most 60), a waiting one is
        answered when it leaves its line or when ``wait`` runs out, whichever comes first (a long
        poll; the service holds no thread for it)."""
        found = await run_in_threadpool(engine.get, reservation_id)
        if not ledger_ops.visible(token, found):
            raise ReservationNotFound(reservation_id)
        if wait is not None and found.state is ReservationState.WAITING:
            found = await long_poll.until_it_leaves(engine, found, wait)
        return models.ReservationOut.of(scoped.shown(token, found))

    @router.get("/queues/{queue}/waiting", response_model=models.WaitingOut, tags=["ledger"])
    def waiting_line(
        queue: str,
        token: Annotated[Token, reader],
        partition: Annotated[str, Query(max_length=64)] = "default",
        limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
    ) -> models.WaitingOut:
        """The requests waiting for capacity in ``queue``'s subtree, in the order they are tried
        (priority, then arrival), each with its place in the partition's line and what it asks
        for."""
        check_scope(token, partition, queue)
        line = engine.waiting(queue, partition=partition, limit=limit)
        return models.WaitingOut(waiting=[models.ReservationOut.of(scoped.shown(token, r)) for r in line])

    @router.post(
        "/reservations/{reservation_id}/commit", response_model=models.ReservationOut, tags=["ledger"]
    )
    def commit(
        reservation_id: str,
        token: Annotated[Token, service],
        body: Annotated[models.CommitBody | None, Body()] = None,
    ) -> Response:
        """Reserved becomes in use; ``resources`` may commit less (the rest is released)."""
        done = ops.commit(reservation_id, token, body.resources if body is not None else None)
        return ledger_ops.reservation_response(done)

    @router.post(
        "/reservations/{reservation_id}/rollback", response_model=models.ReservationOut, tags=["ledger"]
    )
    def rollback(reservation_id: str, token: Annotated[Token, service]) -> Response:
        return ledger_ops.reservation_response(ops.rollback(reservation_id, token))

    @router.post(
        "/reservations/{reservation_id}/release", response_model=models.ReservationOut, tags=["ledger"]
    )
    def release_reservation(
        reservation_id: str,
        token: Annotated[Token, service],
        body: Annotated[models.ReleaseReservationBody | None, Body()] = None,
    ) -> Response:
        """Release everything a committed reservation holds (its pod is gone)."""
        done = ops.release_reservation(reservation_id, token, finished=body.finished if body else False)
        return ledger_ops.reservation_response(done)

    @router.post("/releases", status_code=204, tags=["ledger"])
    def release(body: models.ReleaseBody, token: Annotated[Token, service]) -> Response:
        """In-use resources of a queue are gone again."""
        check_scope(token, body.partition, body.queue)
        key: Any = scoped.release_key(token, body.partition, body.key)
        try:
            with metrics.observe("release"):
                engine.release(
                    body.queue,
                    body.resources,
                    partition=body.partition,
                    user=body.user,
                    groups=body.groups,
                    application=body.application,
                    finished=body.finished,
                    key=key,
                )
        except IdempotencyConflict as error:  # the key the caller sent, not its scoped form
            raise IdempotencyConflict(error.partition, body.key, None) from None
        return Response(status_code=204)

    # -- queues ------------------------------------------------------------------------------
    @router.get("/queues/{path}/usage", response_model=dict[str, models.UsageOut], tags=["queues"])
    def usage(
        path: str,
        token: Annotated[Token, reader],
        partition: Annotated[str, Query(max_length=64)] = "default",
    ) -> dict[str, models.UsageOut]:
        """Usage of the queue's whole subtree per resource, with its limit."""
        check_scope(token, partition, queues.validate_queue(path))
        return {res: models.UsageOut.of(u) for res, u in engine.usage(path, partition=partition).items()}

    @router.get("/usage/history", response_model=models.UsageHistoryOut, tags=["queues"])
    def usage_history(
        token: Annotated[Token, reader],
        queue: Annotated[str, Query(max_length=255, examples=["root.project-a"])] = "root",
        partition: Annotated[str, Query(max_length=64)] = "default",
        window: Annotated[
            str, Query(max_length=8, description=f"one of {', '.join(history.WINDOWS)}")
        ] = "1h",
    ) -> models.UsageHistoryOut:
        """In-use and reserved usage of the queue's subtree over the last ``window``, rebuilt from
        the journal and the reservations: at most 97 points, oldest first, in base units."""
        check_scope(token, partition, queues.validate_queue(queue))
        found = overview.usage_history(engine, queue, partition=partition, window=window)
        return models.UsageHistoryOut.of(found)

    @router.get("/queues", response_model=dict[str, dict[str, models.UsageOut]], tags=["queues"])
    def queue_tree(
        token: Annotated[Token, reader],
        partition: Annotated[str, Query(max_length=64)] = "default",
    ) -> dict[str, dict[str, models.UsageOut]]:
        """Every queue with usage or a limit (and its ancestors): its subtree's usage per resource
        and its own limit. A queue-restricted token sees its subtree."""
        check_scope(token, partition, token.queue)
        tree = overview.queue_tree(engine, partition)
        return {
            queue: {res: models.UsageOut.of(u) for res, u in usage.items()}
            for queue, usage in tree.items()
            if token.covers(partition, queue)
        }

    @router.put("/queues/{path}/limits", response_model=models.LimitsOut, tags=["queues"])
    def set_limits(
        path: str, body: models.LimitsBody, token: Annotated[Token, admin], response: Response
    ) -> models.LimitsOut:
        """Set (or with null remove) the queue's limits; validated like a config change. A name
        that looks like a typo of a known one is warned about (``warnings``, ``Warning``)."""
        check_scope(token, body.partition, queues.validate_queue(path))
        with metrics.observe("set_limits"):
            made = engine.set_limits(path, body.resources, partition=body.partition)
        if made.warnings:
            response.headers["Warning"] = ledger_ops.warning_header(made.warnings)
        return models.LimitsOut(version=made, warnings=list(made.warnings))

    @router.get("/limits", response_model=dict[str, dict[str, int]], tags=["queues"])
    def limits(
        token: Annotated[Token, reader], partition: Annotated[str, Query(max_length=64)] = "default"
    ) -> dict[str, dict[str, int]]:
        """Every limit in the partition: ``{queue: {resource: limit}}``."""
        check_scope(token, partition, None)
        return engine.limits(partition=partition)

    @router.get("/applications/{application}/summary", tags=["queues"])
    def application_summary(
        application: str,
        token: Annotated[Token, reader],
        partition: Annotated[str, Query(max_length=64)] = "default",
    ) -> dict[str, Any]:
        """The usage summary of the application's last finished run."""
        check_scope(token, partition, None)
        return engine.application_summary(application, partition=partition)

    @router.put("/namespaces/{name}", tags=["kubernetes"])
    def put_namespace(
        name: str,
        manifest: Annotated[dict[str, Any], Body()],
        token: Annotated[Token, admin],
        partition: Annotated[str, Query(max_length=64)] = "default",
    ) -> dict[str, str]:
        """Place a Kubernetes Namespace on its queue (YuniKorn's annotations); returns the queue."""
        check_scope(token, partition, None)
        meta = manifest.get("metadata") or {}
        if not isinstance(meta, dict) or meta.get("name") != name:
            raise HTTPException(422, "metadata.name must match the path")
        return {"queue": engine.apply_namespace(manifest, partition=partition)}

    # -- configuration -----------------------------------------------------------------------
    @router.get(
        "/config",
        tags=["config"],
        responses={200: {"content": {"application/yaml": {"schema": {"type": "string"}}}}},
    )
    def get_config(token: Annotated[Token, reader], accept: Annotated[str | None, Header()] = None) -> Any:
        """The YuniKorn queue configuration in force: as JSON, ``{"version", "config"}``; with
        ``Accept: application/yaml``, the configuration as YAML (version in ``X-Config-Version``).
        Either can be sent back to ``PUT /v1/config`` unchanged."""
        check_scope(token, None, None)
        version, document = config_views.current(engine)
        if config_views.wants_yaml(accept):
            return config_views.yaml_response(version, document)
        return {"version": version, "config": document}

    config_body = {
        "content": {
            "application/yaml": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "object"}},
        },
        "required": True,
    }

    @router.put(
        "/config",
        response_model=models.VersionOut,
        tags=["config"],
        openapi_extra={"requestBody": config_body},
    )
    async def put_config(
        request: Request,
        token: Annotated[Token, admin],
        confirm: Annotated[Literal["remove-all"] | None, Query()] = None,
    ) -> models.VersionOut:
        """Apply a configuration (all or nothing); YAML as application/yaml, or JSON. The same
        configuration again makes no new version. One that removes every limit of a partition
        is refused (409) unless ``?confirm=remove-all``."""
        check_scope(token, None, None)
        source = await _config_source(request)
        allow = confirm == "remove-all"
        with metrics.observe("apply_config"):
            version = await run_in_threadpool(
                functools.partial(engine.apply_config, source, allow_removing_all=allow)
            )
        return models.VersionOut(version=version)

    @router.post(
        "/config/diff",
        response_model=config_models.ConfigDiffOut,
        tags=["config"],
        openapi_extra={"requestBody": config_body},
    )
    async def diff_config(request: Request, token: Annotated[Token, reader]) -> dict[str, Any]:
        """A dry run of ``PUT /v1/config``: the limits it would add, remove and change, and every
        queue, user and group whose current usage would then be over its limit. Changes nothing."""
        check_scope(token, None, None)
        source = await _config_source(request)
        found = await run_in_threadpool(engine.diff_config, source)
        return found.as_dict()

    @router.post(
        "/config/validate",
        response_model=models.ValidationOut,
        tags=["config"],
        openapi_extra={"requestBody": config_body},
    )
    async def validate_config(request: Request, token: Annotated[Token, reader]) -> models.ValidationOut:
        """Every problem of a configuration; changes nothing."""
        source = await _config_source(request)
        problems = await run_in_threadpool(engine.validate_config, source)
        return models.ValidationOut(
            allowed=not problems,
            problems=[
                models.ProblemOut(partition=p.partition, queue=p.queue, limit=p.limit, message=p.message)
                for p in problems
            ],
        )

    # -- Kubernetes --------------------------------------------------------------------------
    @router.put(
        "/resourcequotas/{namespace}/{name}", response_model=models.QuotaStatusOut, tags=["kubernetes"]
    )
    def put_quota(
        namespace: str,
        name: str,
        manifest: Annotated[dict[str, Any], Body()],
        token: Annotated[Token, admin],
        partition: Annotated[str, Query(max_length=64)] = "default",
    ) -> models.QuotaStatusOut:
        """Create or replace a v1 ResourceQuota (its metadata must name this namespace/name)."""
        check_scope(token, partition, None)
        meta = manifest.get("metadata") or {}
        if not isinstance(meta, dict) or meta.get("namespace") != namespace or meta.get("name") != name:
            raise HTTPException(422, "metadata.namespace and metadata.name must match the path")
        with metrics.observe("apply_resource_quota"):
            status = engine.apply_resource_quota(manifest, partition=partition)
        return models.QuotaStatusOut(**status)

    @router.get(
        "/resourcequotas/{namespace}/{name}", response_model=models.QuotaStatusOut, tags=["kubernetes"]
    )
    def get_quota(
        namespace: str,
        name: str,
        token: Annotated[Token, reader],
        partition: Annotated[str, Query(max_length=64)] = "default",
    ) -> models.QuotaStatusOut:
        """``status.hard`` and ``status.used`` in Kubernetes quantities."""
        check_scope(token, partition, None)
        return models.QuotaStatusOut(**engine.resource_quota_status(namespace, name, partition=partition))

    @router.delete("/resourcequotas/{namespace}/{name}", status_code=204, tags=["kubernetes"])
    def delete_quota(
        namespace: str,
        name: str,
        token: Annotated[Token, admin],
        partition: Annotated[str, Query(max_length=64)] = "default",
    ) -> Response:
        check_scope(token, partition, None)
        engine.delete_resource_quota(namespace, name, partition=partition)
        return Response(status_code=204)

    @router.put("/resourcequotas/admission", status_code=204, tags=["kubernetes"])
    def put_admission(
        manifest: Annotated[dict[str, Any], Body()],
        token: Annotated[Token, admin],
        partition: Annotated[str, Query(max_length=64)] = "default",
    ) -> Response:
        """The ResourceQuota admission configuration (``limitedResources``)."""
        check_scope(token, partition, None)
        engine.apply_admission_config(manifest, partition=partition)
        return Response(status_code=204)

    return router


async def _config_source(request: Request) -> Any:
    raw = await request.body()
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in ("application/json", ""):
        try:
            return json.loads(raw or b"null")
        except ValueError as error:
            raise HTTPException(422, f"body is not JSON: {error}") from error
        except RecursionError:
            raise HTTPException(422, f"body nests deeper than {validation.MAX_DEPTH} levels") from None
    if kind in ("application/yaml", "application/x-yaml", "text/yaml", "text/plain"):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise HTTPException(422, "body is not UTF-8") from error
    raise HTTPException(415, f"unsupported content type {kind!r}: use application/yaml or application/json")
