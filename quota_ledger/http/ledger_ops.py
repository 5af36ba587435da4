"""The reservation operations of the HTTP API: reserve, commit, rollback and release, each
with its token checks. ``POST /v1/reservations`` and its siblings run one of them per request;
``POST /v1/batch`` plans many and has the engine decide them together, each exactly as its single
request would be decided."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core
from fastapi.responses import Response

from quota_ledger.engine import Operation, QuotaEngine
from quota_ledger.http import models, scoped
from quota_ledger.http.auth import check_scope
from quota_ledger.http.metrics import Metrics
from quota_ledger.kube import pods
from quota_ledger.model.errors import IdempotencyConflict, InvalidRequest, ReservationNotFound
from quota_ledger.model.values import Reservation
from quota_ledger.runtime.tokens import Token

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


def reserve_arguments(body: models.ReserveBody, key: str | None) -> dict[str, Any]:
    """The keyword arguments of ``QuotaEngine.reserve`` a queue request's body gives (but the
    queue, the resources and how it waits)."""
    return {
        "partition": body.partition,
        "user": body.user,
        "groups": body.groups,
        "application": body.application,
        "priority_class": body.priority_class,
        "ttl": body.ttl,
        "key": key,
        "terminating": body.terminating,
        "best_effort": body.best_effort,
        "cross_namespace_affinity": body.cross_namespace_affinity,
    }


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
    #: a reserve's operation under another key (for a key held outside the token's subtree)
    rekey: Callable[[str], Operation[Reservation]] | None = None
    #: the key the caller sent, when this operation runs under its scoped form
    sent_key: str | None = None


class LedgerOps:
    """One engine's reservation operations as a token may run them. Each is planned first
    (checked, nothing decided) and then decided, alone (:meth:`decide`) or with many others
    from one thread (:meth:`decide_all`), with the same outcome either way."""

    def __init__(self, engine: QuotaEngine, metrics: Metrics) -> None:
        self.engine = engine
        self.metrics = metrics

    def reserve(self, body: models.ReserveBody, token: Token, key: Any) -> Reservation:
        """Reserve in a queue, or what a Pod needs: 403 outside the token's scope. A key held
        by a reservation the token may not see is no conflict: the reservation is made under
        the key's scoped form (:mod:`quota_ledger.http.scoped`)."""
        return self.decide(self.plan_reserve(body, token, key))

    def reserve_or_wait(self, body: models.ReserveBody, token: Token, key: Any) -> Reservation:
        """Reserve in a queue, or join its partition's line for ``body.wait`` seconds when the
        request does not fit (the reservation then waits, with its position): 403 outside the
        token's scope, 422 for a pod (a pod's admission is decided at once)."""
        if body.pod is not None:
            raise InvalidRequest("a pod does not wait in line: leave out wait", field="wait")
        if body.queue is None:
            raise InvalidRequest("queue is required", field="queue")
        check_scope(token, body.partition, body.queue)
        started = time.perf_counter()
        try:
            made = self.engine.reserve(
                body.queue,
                body.resources,
                **reserve_arguments(body, key),
                wait=body.wait,
                block=False,
                priority=body.priority,
            )
        except Exception as error:
            self.metrics.record("reserve", started, error)
            raise
        self.metrics.record("reserve", started)
        return scoped.shown(token, made)

    def commit(
        self, reservation_id: str, token: Token, resources: Mapping[str, Any] | None = None
    ) -> Reservation:
        return self.decide(self.plan_commit(reservation_id, token, resources))

    def rollback(self, reservation_id: str, token: Token) -> Reservation:
        return self.decide(self.plan_rollback(reservation_id, token))

    def plan_reserve(self, body: models.ReserveBody, token: Token, key: Any) -> Planned:
        """:meth:`reserve`, checked; raises its refusal of the request (403, 422...)."""
        planned = self._plan("reserve", token, lambda: self._prepare_reserve(body, token, key))
        if token.queue is None:
            return planned
        return dataclasses.replace(planned, rekey=lambda other: self._prepare_reserve(body, token, other))

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
        """Decide a planned operation: its reservation as the token sees it, or raises its
        refusal."""
        try:
            reservation = self.engine.decide(planned.operation)
        except Exception as error:
            settled = self._settled(planned, error)
            if isinstance(settled, Planned):
                return self.decide(settled)
            if settled is error:
                raise
            raise settled from None
        self.metrics.record(planned.name, planned.started)
        return scoped.shown(planned.token, reservation)

    def decide_all(self, planned: Sequence[Planned]) -> list[Reservation | Exception]:
        """Decide many planned operations from this thread, each as :meth:`decide` would: in
        order, each one's reservation or refusal."""
        outcomes = self.engine.decide_all([p.operation for p in planned])
        decided: list[Reservation | Exception] = []
        again: list[tuple[int, Planned]] = []  # reserves to make under a scoped key
        for p, outcome in zip(planned, outcomes, strict=True):
            if isinstance(outcome, Exception):
                settled = self._settled(p, outcome)
                if isinstance(settled, Planned):
                    again.append((len(decided), settled))
                    settled = outcome  # replaced below
                decided.append(settled)
            else:
                self.metrics.record(p.name, p.started)
                decided.append(scoped.shown(p.token, outcome))
        if again:
            for (where, _), outcome in zip(again, self.decide_all([p for _, p in again]), strict=True):
                decided[where] = outcome
        return decided

    def _plan(self, name: str, token: Token, prepare: Callable[[], Operation[Reservation]]) -> Planned:
        started = time.perf_counter()
        try:
            operation = prepare()
        except Exception as error:
            self.metrics.record(name, started, error)
            raise
        return Planned(name, token, operation, started)

    def _settled(self, planned: Planned, error: Exception) -> Exception | Planned:
        """The refusal the token gets, or the reserve to make instead.

        An idempotency conflict with a reservation the token may not see is no conflict for
        it: the reserve is made again under the key's scoped form (once). A conflict names the
        reservation only if the token may see it, and the key the caller sent; an over-quota
        refusal shows no usage outside the token's subtree.
        """
        if not isinstance(error, IdempotencyConflict) or error.reservation_id is None:
            self.metrics.record(planned.name, planned.started, error)
            return scoped.refusal(planned.token, error)
        sent = planned.sent_key if planned.sent_key is not None else error.key
        try:
            mine = visible(planned.token, self.engine.get(error.reservation_id))
        except Exception as failed:  # reading it failed: the token gets that error instead
            self.metrics.record(planned.name, planned.started, failed)
            return failed
        other = scoped.scoped_key(planned.token, error.partition, sent)
        if not mine and planned.rekey is not None and other is not None:
            try:
                operation = planned.rekey(other)
            except Exception as failed:
                self.metrics.record(planned.name, planned.started, failed)
                return failed
            return Planned(planned.name, planned.token, operation, planned.started, sent_key=sent)
        self.metrics.record(planned.name, planned.started, error)
        return IdempotencyConflict(error.partition, sent, error.reservation_id if mine else None)

    def _prepare_reserve(self, body: models.ReserveBody, token: Token, key: Any) -> Operation[Reservation]:
        engine = self.engine
        if body.wait is not None:  # (POST /v1/reservations takes it; a batch's reserve does not)
            raise InvalidRequest("a reserve in a batch does not wait: send it alone", field="wait")
        if isinstance(body.priority, bool) or body.priority != 0:
            raise InvalidRequest("priority orders requests that wait: send wait too", field="priority")
        if body.pod is not None:
            namespace = pods.parse_pod(body.pod).namespace
            check_scope(token, body.partition, engine.namespace_queue(namespace, partition=body.partition))
            return engine.prepare_reserve_pod(body.pod, partition=body.partition, ttl=body.ttl, key=key)
        if body.queue is None:
            raise InvalidRequest("queue is required (or a pod)", field="queue")
        check_scope(token, body.partition, body.queue)
        return engine.prepare_reserve(body.queue, body.resources, **reserve_arguments(body, key))

    def by_key(self, key: str, token: Token, partition: str) -> Reservation:
        """The reservation ``token`` made with ``key``: the one stored under the key if the
        token may see it, else the one under the key's scoped form; a key held only outside
        the token's scope is not found, as if it had never been used."""
        try:
            found = self.engine.get_by_key(key, partition=partition)
        except ReservationNotFound:
            found = None
        if found is not None and visible(token, found):
            return scoped.shown(token, found)
        other = scoped.scoped_key(token, partition, key)
        if other is not None:
            try:
                mine = self.engine.get_by_key(other, partition=partition)
            except ReservationNotFound:
                pass
            else:
                if visible(token, mine):
                    return scoped.shown(token, mine)
        raise ReservationNotFound(key)  # the same answer as for a key never used

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
            done = self.engine.release_reservation(reservation_id, finished=finished)
        return scoped.shown(token, done)


def visible(token: Token, reservation: Reservation) -> bool:
    """Whether the reservation lies inside the token's partition and queue subtree."""
    return token.covers(reservation.partition, reservation.queue)
