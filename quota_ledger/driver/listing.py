"""Listing reservations by queue subtree, state, user, application and age; no locks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, or_, select

from quota_ledger.driver.reservations import _READ_MANY, _many
from quota_ledger.driver.schema import reservations
from quota_ledger.model.listing import ReservationQuery
from quota_ledger.model.queues import subtree_bounds
from quota_ledger.model.values import Reservation

_R = reservations.c


def _ids(wanted: ReservationQuery, now: datetime, limit: int) -> Any:
    """find_reservations: ids of the partition's reservations that match, oldest first (then by
    id); no lock. Built from the filters given: every value is a bound parameter."""
    where: list[Any] = [_R.partition == wanted.partition]
    if wanted.queue is not None:
        low, high = subtree_bounds(wanted.queue)
        where.append(or_(_R.queue == wanted.queue, and_(_R.queue >= low, _R.queue < high)))
    if wanted.state is not None:
        where.append(_R.state == wanted.state.value)
    if wanted.user is not None:
        where.append(_R.user_name == wanted.user)
    if wanted.application is not None:
        where.append(_R.application == wanted.application)
    if wanted.older_than is not None:
        where.append(_R.created_at < now - wanted.older_than)
    return select(_R.id, _R.created_at).where(*where).order_by(_R.created_at, _R.id).limit(limit)


def find_reservations(
    conn: Connection, wanted: ReservationQuery, now: datetime, limit: int
) -> list[Reservation]:
    """Up to ``limit`` reservations ``wanted`` names, oldest first; ``now`` is the database's
    clock (naive UTC, as stored), against which ``older_than`` counts."""
    ids = [row.id for row in conn.execute(_ids(wanted, now, limit))]
    if not ids:
        return []
    found = {s.reservation.id: s.reservation for s in _many(conn.execute(_READ_MANY, {"ids": ids}).all())}
    return [found[rid] for rid in ids if rid in found]
