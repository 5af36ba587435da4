"""Read-only statements for the dashboard and metrics; no locks."""

from __future__ import annotations

from sqlalchemy import Connection, Integer, String, bindparam, func, select

from quota_ledger.driver import dialect
from quota_ledger.driver.reservations import _READ_MANY, _many
from quota_ledger.driver.schema import PENDING, reservations
from quota_ledger.model.values import StoredReservation

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
# ids_with_prefix: reservation ids starting with a prefix. The range keeps it on the primary
# key's index under any collation; LIKE then keeps only true prefixes (the range may admit more
# where a collation ignores the hyphens).
_IDS_WITH_PREFIX = (
    select(_R.id)
    .where(
        _R.id >= bindparam("low", type_=String),
        _R.id < bindparam("high", type_=String),
        _R.id.like(bindparam("pattern", type_=String)),
    )
    .order_by(_R.id)
    .limit(bindparam("n", type_=Integer))
)
# expired_backlog: pending reservations whose time ran out (what a sweep will expire), all partitions.
_EXPIRED_BACKLOG = select(func.count()).where(_R.state == PENDING, _R.expires_at <= dialect.utcnow())


def expired_backlog(conn: Connection) -> int:
    return int(conn.execute(_EXPIRED_BACKLOG).scalar_one())


def pending_summary(conn: Connection) -> list[tuple[str, int, float]]:
    rows = conn.execute(_PENDING).all()
    return [(r.partition, int(r.n), max(0.0, (r.now - r.oldest).total_seconds())) for r in rows]


def soonest_expiring(conn: Connection, partition: str, limit: int) -> list[StoredReservation]:
    ids = list(conn.execute(_SOONEST, {"p": partition, "n": limit}).scalars())
    if not ids:
        return []
    found = _many(conn.execute(_READ_MANY, {"ids": ids}).all())
    return sorted(found, key=lambda s: s.reservation.expires_at)


def ids_with_prefix(conn: Connection, prefix: str, limit: int) -> list[str]:
    """Up to ``limit`` reservation ids starting with ``prefix`` (lowercase hex digits and
    hyphens, at least one digit), in order."""
    low = prefix.rstrip("-")
    if not low:
        return []
    last = low[-1]
    high = low[:-1] + ("a" if last == "9" else chr(ord(last) + 1))
    params = {"low": low, "high": high, "pattern": prefix + "%", "n": limit}
    return list(conn.execute(_IDS_WITH_PREFIX, params).scalars())
