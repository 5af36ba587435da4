"""The reservation operations of the HTTP API: reserve, commit, rollback and release, each
with its token checks. ``POST /v1/reservations`` and its siblings run one of them per request;
``POST /v1/batch`` plans many and has the engine decide them together, each exactly as its single
request would be decided."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core
from fastapi.responses import Response

from quota_ledger.engine import Operation, QuotaEngine
from quota_ledger.http import models
from quota_ledger.http.auth import check_scope
from quota_ledger.http.metrics import Metrics
from quota_ledger.kube import pods
from quota_ledger.model.errors import IdempotencyConflict, InvalidRequest, ReservationNotFound
from quota_ledger.model.values import Reservation
from quota_ledger.service.tokens import Token

_FIELDS = tuple(models.ReservationOut.model_fields)


def reservation_body(reservation: Reservation) -> dict[str, Any]:
    """The JSON body of a reservation (:class:`models.ReservationOut`), datetimes as ISO text.

    Built field by field: ``dataclasses.asdict`` deep-copies every value, and validating the
    response model again costs as much as the rest of a request's Python.
    """
    found = {name: getattr(reservation, name) for name in _FIELDS}
    found["state"] = reservation.state.value
    found["groups"] = list(reservation.groups)
    found["warnings"] = list(reservation.warnings)
    return pydantic_core.to_jsonable_python(found)  # type: ignore[no-any-return]


def reservation_response(reservation: Reservation, status_code: int = 200) -> Response:
    """A reservation as the answer to a request: the bytes ``ReservationOut`` would give."""
    found = {name: getattr(reservation, name) for name in _FIELDS}
    found["state"] = reservation.state.value
    found["groups"] = list(reservation.groups)
    found["warnings"] = list(reservation.warnings)
    headers = {"Warning": warning_header(reservation.warnings)} if reservation.warnings else None
    return Response(
        pydantic_core.to_json(found), status_code=status_code, media_type="application/json", headers=headers
    )


def warning_header(warnings: Sequence[str]) -> str:
    """RFC 7234 warn-values with code 299 (miscellaneous persistent warning), as the Kubernetes
    API server sends them: ``299 - "text"``, comma-separated, in ASCII."""
    values = []
    for text in warnings:
        quoted = text.replace("\\", "\\\\").replace('"', '\\"')
        values.append(f'299 - "{quoted}"'.encode("ascii", "backslashreplace").decode("ascii"))
    return ", ".join(values)


@dataclass(frozen=True, slots=True)
class Planned:
    """A reservation operation checked for a token, waiting to be decided."""

    #: ``reserve``, ``commit`` or ``rollback``: the operation's name in the metrics
    name: str
    token: Token
    operation: Operation[Reservation]
    #: ``time.perf_counter()`` when it was asked for (its latency runs from there)
    started: float


class LedgerOps:
    """One engine's reservation operations as a token may run them. Each is planned first
    (checked, nothing decided) and then decided, alone (:meth:`decide`) or with many others
    from one thread (:meth:`decide_all`), with the same outcome either way."""

    def __init__(self, engine: QuotaEngine, metrics: Metrics) -> None:
        self.engine = engine
        self.metrics = metrics

    def reserve(self, body: models.ReserveBody, token: Token, key: Any) -> Reservation:
        """Reserve in a queue, or what a Pod needs: 403 outside the token's scope; an
        idempotency conflict names the reservation only if the token may see it."""
        return self.decide(self.plan_reserve(body, token, key))

    def commit(
        self, reservation_id: str, token: Token, resources: Mapping[str, Any] | None = None
    ) -> Reservation:
        return self.decide(self.plan_commit(reservation_id, token, resources))

    def rollback(self, reservation_id: str, token: Token) -> Reservation:
        return self.decide(self.plan_rollback(reservation_id, token))

    def plan_reserve(self, body: models.ReserveBody, token: Token, key: Any) -> Planned:
        """:meth:`reserve`, checked; raises its refusal of the request (403, 422...)."""
        return self._plan("reserve", token, lambda: self._prepare_reserve(body, token, key))

    def plan_commit(
        self, reservation_id: str, token: Token, resources: Mapping[str, Any] | None = None
    ) -> Planned:
        """:meth:`commit`, checked (a reservation outside the token's scope is not found)."""
        self.owned(reservation_id, token)
        return self._plan("commit", token, lambda: self.engine.prepare_commit(reservation_id, resources))

    def plan_rollback(self, reservation_id: str, token: Token) -> Planned:
        """:meth:`rollback`, checked (a reservation outside the token's scope is not found)."""
        self.owned(reservation_id, token)
        return self._plan("rollback", token, lambda: self.engine.prepare_rollback(reservation_id))

    def decide(self, planned: Planned) -> Reservation:
        """Decide a planned operation: its reservation, or raises its refusal."""
        try:
            reservation = self.engine.decide(planned.operation)
        except Exception as error:
            shown = self._settled(planned, error)
            if shown is error:
                raise
            raise shown from None
        self.metrics.record(planned.name, planned.started)
        return reservation

    def decide_all(self, planned: Sequence[Planned]) -> list[Reservation | Exception]:
        """Decide many planned operations from this thread, each as :meth:`decide` would: in
        order, each one's reservation or refusal."""
        outcomes = self.engine.decide_all([p.operation for p in planned])
        decided: list[Reservation | Exception] = []
        for p, outcome in zip(planned, outcomes, strict=True):
            if isinstance(outcome, Exception):
                decided.append(self._settled(p, outcome))
            else:
                self.metrics.record(p.name, p.started)
                decided.append(outcome)
        return decided

    def _plan(self, name: str, token: Token, prepare: Callable[[], Operation[Reservation]]) -> Planned:
        started = time.perf_counter()
        try:
            operation = prepare()
        except Exception as error:
            self.metrics.record(name, started, error)
            raise
        return Planned(name, token, operation, started)

    def _settled(self, planned: Planned, error: Exception) -> Exception:
        """The refusal the token gets: an idempotency conflict names the reservation only if
        the token may see it (the key may belong to one outside its scope)."""
        self.metrics.record(planned.name, planned.started, error)
        if not isinstance(error, IdempotencyConflict) or error.reservation_id is None:
            return error
        try:
            if visible(planned.token, self.engine.get(error.reservation_id)):
                return error
        except Exception as failed:  # reading it failed: the token gets that error instead
            return failed
        return IdempotencyConflict(error.partition, error.key, None)

    def _prepare_reserve(self, body: models.ReserveBody, token: Token, key: Any) -> Operation[Reservation]:
        engine = self.engine
        if body.pod is not None:
            namespace = pods.parse_pod(body.pod).namespace
            check_scope(token, body.partition, engine.namespace_queue(namespace, partition=body.partition))
            return engine.prepare_reserve_pod(body.pod, partition=body.partition, ttl=body.ttl, key=key)
        if body.queue is None:
            raise InvalidRequest("queue is required (or a pod)", field="queue")
        check_scope(token, body.partition, body.queue)
        return engine.prepare_reserve(
            body.queue,
            body.resources,
            partition=body.partition,
            user=body.user,
            groups=body.groups,
            application=body.application,
            priority_class=body.priority_class,
            ttl=body.ttl,
            key=key,
            terminating=body.terminating,
            best_effort=body.best_effort,
            cross_namespace_affinity=body.cross_namespace_affinity,
        )

    def owned(self, reservation_id: str, token: Token) -> None:
        """A reservation outside a restricted token's scope is not found, as if it did not exist:
        the token learns nothing about it (not even that it exists)."""
        if token.partition is None and token.queue is None:
            return  # an unrestricted token: no need to read the reservation first
        if not visible(token, self.engine.get(reservation_id)):
            raise ReservationNotFound(reservation_id)

    def release_reservation(self, reservation_id: str, token: Token, *, finished: bool) -> Reservation:
        self.owned(reservation_id, token)
        with self.metrics.observe("release_reservation"):
            return self.engine.release_reservation(reservation_id, finished=finished)


def visible(token: Token, reservation: Reservation) -> bool:
    """Whether the reservation lies inside the token's partition and queue subtree."""
    return token.covers(reservation.partition, reservation.queue)
