"""The reservation operations of the HTTP API: reserve, commit, rollback and release, each
with its token checks. ``POST /v1/reservations`` and its siblings run one of them per request;
``POST /v1/batch`` runs many at once, so that each operation is decided exactly as its single
request would be."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic_core
from fastapi import HTTPException
from fastapi.responses import Response

from quota_ledger.engine import QuotaEngine
from quota_ledger.http import models
from quota_ledger.http.auth import check_scope
from quota_ledger.http.metrics import Metrics
from quota_ledger.kube import pods
from quota_ledger.model.errors import IdempotencyConflict, ReservationNotFound
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
    return pydantic_core.to_jsonable_python(found)  # type: ignore[no-any-return]


def reservation_response(reservation: Reservation, status_code: int = 200) -> Response:
    """A reservation as the answer to a request: the bytes ``ReservationOut`` would give."""
    found = {name: getattr(reservation, name) for name in _FIELDS}
    found["state"] = reservation.state.value
    found["groups"] = list(reservation.groups)
    return Response(pydantic_core.to_json(found), status_code=status_code, media_type="application/json")


class LedgerOps:
    """One engine's reservation operations as a token may run them."""

    def __init__(self, engine: QuotaEngine, metrics: Metrics) -> None:
        self.engine = engine
        self.metrics = metrics

    def reserve(self, body: models.ReserveBody, token: Token, key: Any) -> Reservation:
        """Reserve in a queue, or what a Pod needs: 403 outside the token's scope; an
        idempotency conflict names the reservation only if the token may see it."""
        try:
            return self._reserve(body, token, key)
        except IdempotencyConflict as conflict:
            # The key may belong to a reservation outside the token's scope: do not name it.
            if conflict.reservation_id is not None and not visible(
                token, self.engine.get(conflict.reservation_id)
            ):
                raise IdempotencyConflict(conflict.partition, conflict.key, None) from None
            raise

    def _reserve(self, body: models.ReserveBody, token: Token, key: Any) -> Reservation:
        engine = self.engine
        with self.metrics.observe("reserve"):
            if body.pod is not None:
                namespace = pods.parse_pod(body.pod).namespace
                check_scope(
                    token, body.partition, engine.namespace_queue(namespace, partition=body.partition)
                )
                return engine.reserve_pod(body.pod, partition=body.partition, ttl=body.ttl, key=key)
            if body.queue is None:
                raise HTTPException(422, "queue is required (or a pod)")
            check_scope(token, body.partition, body.queue)
            return engine.reserve(
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

    def commit(
        self, reservation_id: str, token: Token, resources: Mapping[str, Any] | None = None
    ) -> Reservation:
        self.owned(reservation_id, token)
        with self.metrics.observe("commit"):
            return self.engine.commit(reservation_id, resources)

    def rollback(self, reservation_id: str, token: Token) -> Reservation:
        self.owned(reservation_id, token)
        with self.metrics.observe("rollback"):
            return self.engine.rollback(reservation_id)

    def release_reservation(self, reservation_id: str, token: Token, *, finished: bool) -> Reservation:
        self.owned(reservation_id, token)
        with self.metrics.observe("release_reservation"):
            return self.engine.release_reservation(reservation_id, finished=finished)


def visible(token: Token, reservation: Reservation) -> bool:
    """Whether the reservation lies inside the token's partition and queue subtree."""
    return token.covers(reservation.partition, reservation.queue)
