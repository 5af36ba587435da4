"""Listing reservations by queue subtree, state, user, application and age; no locks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, bindparam, or_, select

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


# held_keys: the keyed reservations that still hold something (pending, or committed and not
# released), oldest first; no lock. Reads the partition's keyed rows (its key index).
_HELD = (
    select(_R.key, _R.id, _R.state)
    .where(
        _R.partition == bindparam("p"),
        _R.key.is_not(None),
        or_(_R.state == "pending", and_(_R.state == "committed", _R.released_at.is_(None))),
    )
    .order_by(_R.created_at, _R.id)
)


def held_keys(conn: Connection, partition: str) -> list[tuple[str, str, str]]:
    """(key, id, state) of every keyed reservation of ``partition`` that still holds something:
    pending, or committed and not released."""
    return [(row.key, row.id, row.state) for row in conn.execute(_HELD, {"p": partition})]
