"""A client of the HTTP service with the engine's methods, so the CLI can drive a running
service (``--url``, ``--token``) exactly as it drives a database. Errors come back as the same
exception classes, rebuilt from the service's JSON.

httpx is imported when a client is made, not with this module: the CLI imports this module, and
a plain install (no ``remote`` extra) must still run every command that works on a database."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import yaml

from quota_ledger.cli import credentials
from quota_ledger.config.diff import ConfigDiff
from quota_ledger.model import errors
from quota_ledger.model.values import (
    Blocker,
    ConfigProblem,
    Drift,
    Explanation,
    Holder,
    HolderKind,
    IdleCounter,
    LimitsVersion,
    Reservation,
    ReservationState,
    Usage,
    Violation,
)

if TYPE_CHECKING:
    import httpx

#: the longest long poll the service answers, seconds
LONG_POLL = 60.0
INSTALL_HINT = "pip install -e '.[remote]' in a clone (pip install 'quota-ledger[remote]' from an index)"


class RemoteEngine:
    """The subset of :class:`~quota_ledger.QuotaEngine` the CLI uses, over HTTP."""

    def __init__(
        self, url: str, token: str | None, *, token_source: str | None = None, timeout: float = 30.0
    ) -> None:
        self._httpx = _import_httpx()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        #: what a 401 should tell the user to do
        self._token_hint = (
            f"check the token given by {token_source or '--token or QUOTA_LEDGER_TOKEN'}"
            if token
            else credentials.HOW_TO_GIVE
        )
        self.client = self._httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self.client.close()

    # -- plumbing ----------------------------------------------------------------------------
    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.client.request(method, path, **kwargs)
        except self._httpx.HTTPError as error:
            raise errors.DatabaseUnavailable(f"service unreachable: {error}") from error
        if response.status_code == 401:
            raise errors.QuotaLedgerError(f"{_error(response)}: {self._token_hint}")
        if response.status_code >= 400:
            raise _error(response)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    # -- ledger ------------------------------------------------------------------------------
    def reserve(
        self, queue: str, resources: Mapping[str, Any], *, block: bool = True, **options: Any
    ) -> Reservation:
        """``POST /v1/reservations``; with ``wait``, a 202 (it waits in line) is long-polled
        (``GET /v1/reservations/{id}?wait=``) until it leaves the line or ``wait`` runs out
        (:class:`WaitTimeout`; the service ends it as expired when its wait runs out)."""
        body = {"queue": queue, "resources": dict(resources), **_options(options)}
        made = _reservation(self._call("POST", "/v1/reservations", json=body))
        wait = body.get("wait")
        if made.state is not ReservationState.WAITING or not block or wait is None:
            return made
        deadline = time.monotonic() + float(wait)
        path = f"/v1/reservations/{quote(made.id, safe='')}"
        while made.state is ReservationState.WAITING and time.monotonic() < deadline:
            left = deadline - time.monotonic()
            made = _reservation(self._call("GET", path, params={"wait": min(left, LONG_POLL)}))
        if made.state in (ReservationState.WAITING, ReservationState.EXPIRED):
            # (the service ends a wait that ran out as expired)
            explained = self.explain(
                queue, resources, **{**options, "key": None, "wait": None, "priority": 0}
            )
            raise errors.WaitTimeout(made.id, explained.violations)
        return made

    def waiting(
        self, queue: str | None = None, *, partition: str = "default", limit: int = 1000
    ) -> list[Reservation]:
        """``GET /v1/queues/{queue}/waiting``: the line, in the order it is tried."""
        found = self._call(
            "GET",
            f"/v1/queues/{quote(queue or 'root', safe='')}/waiting",
            params={"partition": partition, "limit": limit},
        )
        return [_reservation(each) for each in found["waiting"]]

    def explain(self, queue: str, resources: Mapping[str, Any], **options: Any) -> Explanation:
        """``POST /v1/reservations?dryRun=All``: 201 admitted, 409 with the blockers."""
        body = {"queue": queue, "resources": dict(resources), **_options(options)}
        try:
            response = self.client.post("/v1/reservations", params={"dryRun": "All"}, json=body)
        except self._httpx.HTTPError as error:
            raise errors.DatabaseUnavailable(f"service unreachable: {error}") from error
        found = response.json() if response.status_code in (201, 409) else None
        if not isinstance(found, dict) or "admitted" not in found:
            raise _error(response)
        return _explanation(found)

    def reserve_pod(
        self, pod: Any, *, partition: str = "default", ttl: float | None = None, key: str | None = None
    ) -> Reservation:
        body = {"pod": _document(pod), "partition": partition, "ttl": ttl, "key": key}
        return _reservation(self._call("POST", "/v1/reservations", json=_options(body)))

    def get(self, reservation_id: str) -> Reservation:
        return _reservation(self._call("GET", f"/v1/reservations/{quote(reservation_id, safe='')}"))

    def commit(self, reservation_id: str, resources: Mapping[str, Any] | None = None) -> Reservation:
        body = {"resources": dict(resources)} if resources is not None else None
        return _reservation(
            self._call("POST", f"/v1/reservations/{quote(reservation_id, safe='')}/commit", json=body)
        )

    def rollback(self, reservation_id: str) -> Reservation:
        return _reservation(self._call("POST", f"/v1/reservations/{quote(reservation_id, safe='')}/rollback"))

    def release(self, queue: str, resources: Mapping[str, Any], **options: Any) -> None:
        self._call(
            "POST", "/v1/releases", json={"queue": queue, "resources": dict(resources), **_options(options)}
        )

    def release_pod(
        self, pod: Any, *, partition: str = "default", key: str | None = None, finished: bool = False
    ) -> Reservation:
        meta = _document(pod).get("metadata") or {}
        lookup = key or meta.get("uid")
        if not lookup:
            raise errors.InvalidRequest("the pod has no metadata.uid: pass key=", field="key")
        return self._release_by_key(partition, str(lookup), finished)

    def _release_by_key(self, partition: str, key: str, finished: bool) -> Reservation:
        found = self._call("GET", "/v1/reservations", params={"partition": partition, "key": key})
        rid = found["id"]
        return _reservation(
            self._call("POST", f"/v1/reservations/{rid}/release", json={"finished": finished})
        )

    def usage(self, queue: str, *, partition: str = "default") -> dict[str, Usage]:
        found = self._call(
            "GET", f"/v1/queues/{quote(queue, safe='')}/usage", params={"partition": partition}
        )
        return {
            r: Usage(in_use=u["in_use"], reserved=u["reserved"], limit=u["limit"]) for r, u in found.items()
        }

    def queue_tree(self, partition: str = "default") -> dict[str, dict[str, Usage]]:
        found = self._call("GET", "/v1/queues", params={"partition": partition})
        return {
            queue: {
                r: Usage(in_use=u["in_use"], reserved=u["reserved"], limit=u["limit"]) for r, u in v.items()
            }
            for queue, v in found.items()
        }

    def reservation_ids(self, prefix: str, limit: int) -> list[str]:
        return list(self._call("GET", "/v1/reservation-ids", params={"prefix": prefix, "limit": limit}))

    def set_limits(
        self, queue: str, resources: Mapping[str, Any], *, partition: str = "default"
    ) -> LimitsVersion:
        body = {"resources": dict(resources), "partition": partition}
        made = self._call("PUT", f"/v1/queues/{quote(queue, safe='')}/limits", json=body)
        return LimitsVersion(int(made["version"]), tuple(made.get("warnings") or ()))

    def limits(self, *, partition: str = "default") -> dict[str, dict[str, int]]:
        return dict(self._call("GET", "/v1/limits", params={"partition": partition}))

    def list_reservations(
        self, *, partition: str = "default", limit: int = 100, **filters: Any
    ) -> list[Reservation]:
        params = {
            "partition": partition,
            "limit": limit,
            **{k: v for k, v in filters.items() if v is not None},
        }
        if isinstance(params.get("older_than"), timedelta):
            params["older_than"] = str(int(params["older_than"].total_seconds()))
        found = self._call("GET", "/v1/reservations", params=params)
        return [_reservation(r) for r in found["reservations"]]

    def prune(self, *, apply: bool = False, partition: str | None = None) -> list[IdleCounter]:
        params: dict[str, Any] = {"apply": "true" if apply else "false"}
        if partition:
            params["partition"] = partition
        return [IdleCounter(**c) for c in self._call("POST", "/v1/prune", params=params)["counters"]]

    def audit(self, *, fix: bool = False, partition: str | None = None) -> list[Drift]:
        params: dict[str, Any] = {"fix": "true" if fix else "false"}
        if partition:
            params["partition"] = partition
        return [Drift(**d) for d in self._call("POST", "/v1/audit", params=params)]

    # -- configuration -----------------------------------------------------------------------
    def apply_config(self, source: Any, *, allow_removing_all: bool = False) -> int:
        params = {"confirm": "remove-all"} if allow_removing_all else {}
        return int(self._call("PUT", "/v1/config", params=params, **_config_body(source))["version"])

    def diff_config(self, source: Any) -> ConfigDiff:
        return ConfigDiff.from_dict(self._call("POST", "/v1/config/diff", **_config_body(source)))

    def validate_config(self, source: Any) -> list[ConfigProblem]:
        found = self._call("POST", "/v1/config/validate", **_config_body(source))
        return [ConfigProblem(**p) for p in found["problems"]]

    def config(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/config")["config"])

    def config_version(self) -> int:
        return int(self._call("GET", "/v1/config")["version"])

    def user_usage(self, user: str, *, partition: str = "default") -> dict[str, Any]:
        return dict(self._call("GET", f"/ws/v1/partition/{partition}/usage/user/{quote(user, safe='')}"))

    def user_usages(self, *, partition: str = "default") -> list[dict[str, Any]]:
        return list(self._call("GET", f"/ws/v1/partition/{partition}/usage/users"))

    def group_usage(self, group: str, *, partition: str = "default") -> dict[str, Any]:
        return dict(self._call("GET", f"/ws/v1/partition/{partition}/usage/group/{quote(group, safe='')}"))

    def group_usages(self, *, partition: str = "default") -> list[dict[str, Any]]:
        return list(self._call("GET", f"/ws/v1/partition/{partition}/usage/groups"))

    def application_summary(self, application: str, *, partition: str = "default") -> dict[str, Any]:
        path = f"/v1/applications/{quote(application, safe='')}/summary"
        return dict(self._call("GET", path, params={"partition": partition}))

    def apply_namespace(self, manifest: Any, *, partition: str = "default") -> str:
        doc = _document(manifest)
        name = (doc.get("metadata") or {}).get("name", "")
        path = f"/v1/namespaces/{quote(str(name), safe='')}"
        return str(self._call("PUT", path, json=doc, params={"partition": partition})["queue"])

    # -- Kubernetes --------------------------------------------------------------------------
    def apply_resource_quota(self, manifest: Any, *, partition: str = "default") -> dict[str, Any]:
        doc = _document(manifest)
        meta = doc.get("metadata") or {}
        namespace, name = (quote(str(meta.get(k, "")), safe="") for k in ("namespace", "name"))
        path = f"/v1/resourcequotas/{namespace}/{name}"
        return dict(self._call("PUT", path, json=doc, params={"partition": partition}))

    def delete_resource_quota(self, namespace: str, name: str, *, partition: str = "default") -> None:
        self._call(
            "DELETE",
            f"/v1/resourcequotas/{quote(namespace, safe='')}/{quote(name, safe='')}",
            params={"partition": partition},
        )

    def resource_quota_status(
        self, namespace: str, name: str, *, partition: str = "default"
    ) -> dict[str, Any]:
        path = f"/v1/resourcequotas/{quote(namespace, safe='')}/{quote(name, safe='')}"
        return dict(self._call("GET", path, params={"partition": partition}))

    def apply_admission_config(self, manifest: Any, *, partition: str = "default") -> None:
        self._call(
            "PUT", "/v1/resourcequotas/admission", json=_document(manifest), params={"partition": partition}
        )

    # -- not over HTTP -----------------------------------------------------------------------
    def migrate(self, revision: str = "head") -> None:
        raise errors.InvalidRequest(
            "schema migrations run against the database (--db), not a service", field="url"
        )

    def expire(self, **_: Any) -> int:
        raise errors.InvalidRequest(
            "the service sweeps by itself; run sweep against the database", field="url"
        )


def _import_httpx() -> ModuleType:
    try:
        import httpx
    except ImportError as error:
        raise errors.InvalidRequest(
            f"talking to a service (--url) needs the httpx package: {INSTALL_HINT}", field="url"
        ) from error
    return httpx


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    found = {k: v for k, v in options.items() if v is not None}
    if "groups" in found:
        found["groups"] = list(found["groups"])
    for name in ("ttl", "wait"):
        if isinstance(found.get(name), timedelta):
            found[name] = found[name].total_seconds()
    return found


def _document(manifest: Any) -> dict[str, Any]:
    doc = yaml.safe_load(manifest) if isinstance(manifest, str | bytes) else manifest
    if not isinstance(doc, dict):
        raise errors.InvalidRequest("a manifest must be a mapping", field="manifest")
    return json.loads(json.dumps(doc, default=str))  # type: ignore[no-any-return]


def _config_body(source: Any) -> dict[str, Any]:
    if isinstance(source, str | bytes):
        return {"content": source, "headers": {"Content-Type": "application/yaml"}}
    return {"json": source}


def _reservation(data: Mapping[str, Any]) -> Reservation:
    def when(value: str | None) -> datetime | None:
        return datetime.fromisoformat(value) if value else None

    return Reservation(
        id=data["id"],
        state=ReservationState(data["state"]),
        partition=data["partition"],
        queue=data["queue"],
        resources=dict(data["resources"]),
        created_at=datetime.fromisoformat(data["created_at"]),
        expires_at=datetime.fromisoformat(data["expires_at"]),
        key=data.get("key"),
        user=data.get("user"),
        groups=tuple(data.get("groups") or ()),
        application=data.get("application"),
        priority_class=data.get("priority_class"),
        committed=data.get("committed"),
        resolved_at=when(data.get("resolved_at")),
        released_at=when(data.get("released_at")),
        warnings=tuple(data.get("warnings") or ()),
        priority=int(data.get("priority") or 0),
        position=data.get("position"),
    )


def _error(response: httpx.Response) -> errors.QuotaLedgerError:
    try:
        payload = response.json()
    except ValueError:
        payload = {}
    error = payload.get("error") if isinstance(payload, dict) else None
    if error is None:  # YuniKorn's shape, or something else entirely
        message = payload.get("message") if isinstance(payload, dict) else None
        error = {
            "code": "not_found" if response.status_code == 404 else "http_error",
            "message": message or response.text[:200],
        }
    code, message, details = error.get("code"), error.get("message", ""), error.get("details") or {}
    if code == "over_quota":
        fields = {f.name for f in dataclasses.fields(Violation)}
        refused = errors.OverQuota([])
        # A limit outside a restricted token's subtree comes without its usage (null in_use
        # and reserved), which Violation.describe cannot print: the service's message says it.
        refused.violations = [
            Violation(**{k: v for k, v in d.items() if k in fields}) for d in details.get("violations", [])
        ]
        refused.args = (message,)
        return refused
    if code == "managed_queue":
        managed = errors.ManagedQueue(
            str(details.get("queue", "")), str(details.get("owned", "")), str(details.get("manager", ""))
        )
        managed.args = (message,)
        return managed
    if code == "removes_all_limits":
        return errors.RemovesAllLimits(details.get("partitions", []))
    if code in ("unknown_resource", "unknown_queue"):
        return _unknown_name(code, message, details)
    if code == "invalid_config":
        return errors.ConfigError([ConfigProblem(**p) for p in details.get("problems", [])])
    if code in ("database_unavailable", "schema_not_ready"):
        return errors.DatabaseUnavailable(message)
    if code == "not_found":
        return errors.NotFound(message)
    if response.status_code in (401, 403):
        return errors.QuotaLedgerError(f"{response.status_code}: {message}")
    if response.status_code == 422:
        return errors.InvalidRequest(message, field=details.get("field"))
    return errors.QuotaLedgerError(message)


def _unknown_name(code: str, message: str, details: Mapping[str, Any]) -> errors.InvalidRequest:
    """An ``UnknownResource`` or ``UnknownQueue`` with its facts and the service's message."""
    partition = str(details.get("partition", ""))
    refused: errors.InvalidRequest
    if code == "unknown_resource":
        suggestions = details.get("suggestions") or {}
        refused = errors.UnknownResource(partition, details.get("resources") or [], suggestions, message)
    else:
        refused = errors.UnknownQueue(
            partition, str(details.get("queue", "")), details.get("suggestion"), message
        )
    refused.args = (message,)  # the service's words, already complete
    return refused


def _explanation(found: Mapping[str, Any]) -> Explanation:
    fields = {f.name for f in dataclasses.fields(Violation)}
    holder_fields = {f.name for f in dataclasses.fields(Holder)}
    blockers = tuple(
        Blocker(
            violation=Violation(**{k: v for k, v in b["violation"].items() if k in fields}),
            holders=tuple(
                Holder(
                    **{**{k: v for k, v in h.items() if k in holder_fields}, "kind": HolderKind(h["kind"])}
                )
                for h in b.get("holders", [])
            ),
        )
        for b in found.get("blockers", [])
    )
    return Explanation(
        admitted=bool(found["admitted"]),
        blockers=blockers,
        ahead=found.get("ahead"),
        ahead_needs=dict(found.get("ahead_needs") or {}),
    )
