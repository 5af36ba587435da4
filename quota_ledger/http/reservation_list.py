"""``GET /v1/reservations`` without ``key``: a partition's reservations, filtered, oldest first.

A token restricted to a queue subtree lists only that subtree: without ``queue`` it gets its
own, and a queue outside it is 403, as for every other route."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Query

from quota_ledger.engine import QuotaEngine
from quota_ledger.http import models, scoped
from quota_ledger.http.auth import check_scope
from quota_ledger.model import listing
from quota_ledger.runtime.tokens import Token


@dataclass(frozen=True, slots=True)
class Filters:
    """The query parameters of a listing."""

    queue: str | None
    state: str | None
    user: str | None
    application: str | None
    older_than: str | None
    limit: int


def filters(
    queue: Annotated[
        str | None, Query(max_length=255, description="this queue and every queue below it")
    ] = None,
    state: Annotated[
        str | None, Query(max_length=16, description="pending, committed, rolled_back or expired")
    ] = None,
    user: Annotated[str | None, Query(max_length=255)] = None,
    application: Annotated[str | None, Query(max_length=255)] = None,
    older_than: Annotated[
        str | None, Query(max_length=32, description="made longer ago than this: 90s, 10m, 2h, 1d, 1h30m")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=listing.MAX_LIMIT)] = listing.DEFAULT_LIMIT,
) -> Filters:
    """The listing's filters, from the query string."""
    return Filters(queue, state, user, application, older_than, limit)


def answer(engine: QuotaEngine, token: Token, partition: str, wanted: Filters) -> models.ReservationListOut:
    """The reservations ``wanted`` names that ``token`` may see, and whether more match."""
    queue = wanted.queue if wanted.queue is not None else token.queue
    check_scope(token, partition, queue)
    # One more than asked for tells whether more match (at the largest limit: whether it is full).
    found = engine.list_reservations(
        partition=partition,
        queue=queue,
        state=wanted.state,
        user=wanted.user,
        application=wanted.application,
        older_than=wanted.older_than,
        limit=min(wanted.limit + 1, listing.MAX_LIMIT),
    )
    shown = [models.ReservationOut.of(scoped.shown(token, r)) for r in found[: wanted.limit]]
    # At the largest limit there is no room for one more: a full listing may have more.
    more = len(found) > wanted.limit if wanted.limit < listing.MAX_LIMIT else len(found) == wanted.limit
    return models.ReservationListOut(reservations=shown, more=more)
