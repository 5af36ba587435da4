"""Read-only statements for the dashboard and metrics; no locks."""

from __future__ import annotations

from sqlalchemy import Connection, Integer, bindparam, func, select

from quota_ledger.driver import dialect
from quota_ledger.driver.schema import PENDING, reservations
from quota_ledger.driver.statements import _READ_MANY, StoredReservation, _many

_R = reservations.c
# pending_summary: per partition, pending reservations and the oldest one's creation time.
_PENDING = (
    select(
        _R.partition,
        func.count().label("n"),
        func.min(_R.created_at).label("oldest"),
        dialect.utcnow().label("now"),
    )
    .where(_R.state == "pending")
    .group_by(_R.partition)
)
# soonest_expiring: ids of the pending reservations that expire first (the sweeper's index).
_SOONEST = (
    select(_R.id)
    .where(_R.partition == bindparam("p"), _R.state == PENDING)
    .order_by(_R.expires_at)
    .limit(bindparam("n", type_=Integer))
)


def pending_summary(conn: Connection) -> list[tuple[str, int, float]]:
    rows = conn.execute(_PENDING).all()
    return [(r.partition, int(r.n), max(0.0, (r.now - r.oldest).total_seconds())) for r in rows]


def soonest_expiring(conn: Connection, partition: str, limit: int) -> list[StoredReservation]:
    ids = list(conn.execute(_SOONEST, {"p": partition, "n": limit}).scalars())
    if not ids:
        return []
    found = _many(conn.execute(_READ_MANY, {"ids": ids}).all())
    return sorted(found, key=lambda s: s.reservation.expires_at)
