"""The waiting line: reservations in state ``waiting``, ordered by ``priority`` (higher first),
``queued_at`` (arrival) and ``id``. A waiting row holds nothing: no counter counts it. Its
``expires_at`` is when its wait runs out, and ``ttl_ms`` the ttl its grant starts (the grant
clears it). Rows are locked as reservation rows are (step 3 of the lock order in :mod:`.tx`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Integer, String, and_, bindparam, func, literal_column, or_, select, update
from sqlalchemy import insert as sa_insert

from quota_ledger.driver.schema import reservation_items, reservations
from quota_ledger.model.values import Reservation

_R = reservations.c
_I = reservation_items.c
#: written into the statements, not bound: only then can the planner use the partial line index
_WAITING = literal_column("'waiting'", String)
_IN_LINE = (_R.partition == bindparam("p"), _R.state == _WAITING)
_ORDER = (_R.priority.desc(), _R.queued_at, _R.id)

# line: the ids of a partition's line, in grant order; no lock.
_LINE = select(_R.id).where(*_IN_LINE).order_by(*_ORDER).limit(bindparam("n", type_=Integer))
# line_rows: the same with what each needs, for views; no lock.
_LINE_ROWS = (
    select(
        _R.id,
        _R.queue,
        _R.user_name,
        _R.application,
        _R.priority,
        _R.queued_at,
        _R.expires_at,
        _I.resource,
        _I.amount,
    )
    .select_from(reservations.outerjoin(reservation_items, _I.reservation_id == _R.id))
    .where(*_IN_LINE)
    .order_by(*_ORDER, _I.resource)
)
# run_out: waiting rows whose wait has run out at :now; no lock.
_RUN_OUT = (
    select(_R.id)
    .where(*_IN_LINE, _R.expires_at <= bindparam("now"))
    .order_by(_R.expires_at)
    .limit(bindparam("n", type_=Integer))
)
# entry: a row's place in line; no lock.
_ENTRY = select(_R.priority, _R.queued_at, _R.ttl_ms).where(_R.id == bindparam("id"))
# ahead: how many waiting rows of the partition come before (:pr, :at, :id) in grant order.
_AHEAD = select(func.count()).where(
    *_IN_LINE,
    or_(
        _R.priority > bindparam("pr"),
        and_(
            _R.priority == bindparam("pr"),
            or_(
                _R.queued_at < bindparam("at"), and_(_R.queued_at == bindparam("at"), _R.id < bindparam("id"))
            ),
        ),
    ),
)
# has_line: whether a partition has a line; no lock.
_HAS_LINE = select(_R.id).where(*_IN_LINE).limit(1)
# grant: waiting -> pending, made now; a row this transaction holds.
_GRANT = (
    update(reservations)
    .where(_R.id == bindparam("rid"), _R.state == "waiting")
    .values(created_at=bindparam("now"), expires_at=bindparam("expires"), state="pending", ttl_ms=None)
)
# leave: waiting -> rolled_back or expired; rows this transaction holds.
_LEAVE = (
    update(reservations)
    .where(_R.id.in_(bindparam("ids", expanding=True)), _R.state == "waiting")
    .values(state=bindparam("new_state"), resolved_at=bindparam("now"))
)


@dataclass(frozen=True, slots=True)
class Entry:
    """A waiting row's place in line, and the ttl its grant starts."""

    priority: int
    queued_at: datetime
    ttl_ms: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Waiting:
    """One request of a line, as :meth:`WaitingStatements.line_rows` reads it."""

    id: str
    queue: str
    user: str | None
    application: str | None
    priority: int
    queued_at: datetime
    #: when its wait runs out
    until: datetime
    #: resource -> amount
    needs: dict[str, int]


class WaitingStatements:
    """The statements above, as methods of :class:`~quota_ledger.driver.tx.LedgerTx`."""

    conn: Connection

    def insert_waiting(
        self,
        reservation: Reservation,
        request_hash: str,
        kube: Mapping[str, Any] | None,
        ttl_ms: int,
    ) -> None:
        """A new row in the line: ``reservation`` (state ``waiting``, created when it joins,
        ``expires_at`` when its wait runs out) and its items."""
        self.conn.execute(
            sa_insert(reservations),
            {
                "id": reservation.id,
                "partition": reservation.partition,
                "key": reservation.key,
                "request_hash": request_hash,
                "state": reservation.state.value,
                "queue": reservation.queue,
                "user_name": reservation.user,
                "groups": json.dumps(list(reservation.groups)) if reservation.groups else None,
                "application": reservation.application,
                "priority_class": reservation.priority_class,
                "created_at": _naive(reservation.created_at),
                "expires_at": _naive(reservation.expires_at),
                "resolved_at": None,
                "kube": None if kube is None else json.dumps(kube, sort_keys=True, separators=(",", ":")),
                "released_at": None,
                "priority": reservation.priority,
                "queued_at": _naive(reservation.created_at),
                "ttl_ms": ttl_ms,
            },
        )
        if reservation.resources:
            self.conn.execute(
                sa_insert(reservation_items),
                [
                    {"reservation_id": reservation.id, "resource": res, "amount": n, "committed": None}
                    for res, n in reservation.resources.items()
                ],
            )

    def line(self, partition: str, limit: int) -> list[str]:
        """The ids of the first ``limit`` requests of ``partition``'s line, in grant order."""
        return list(self.conn.execute(_LINE, {"p": partition, "n": limit}).scalars())

    def line_rows(self, partition: str) -> list[Waiting]:
        """``partition``'s line in grant order, with what each request needs."""
        found: dict[str, Waiting] = {}
        for row in self.conn.execute(_LINE_ROWS, {"p": partition}):
            each = found.get(row.id)
            if each is None:
                each = found[row.id] = Waiting(
                    id=row.id,
                    queue=row.queue,
                    user=row.user_name,
                    application=row.application,
                    priority=row.priority,
                    queued_at=_aware(row.queued_at),
                    until=_aware(row.expires_at),
                    needs={},
                )
            if row.resource is not None:
                each.needs[row.resource] = row.amount
        return list(found.values())

    def waits_run_out(self, partition: str, now: datetime, limit: int) -> list[str]:
        """Up to ``limit`` ids of ``partition``'s waiting rows whose wait ran out by ``now``."""
        return list(self.conn.execute(_RUN_OUT, {"p": partition, "now": now, "n": limit}).scalars())

    def line_entry(self, reservation_id: str) -> Entry | None:
        """A row's place in line (None: no such row)."""
        row = self.conn.execute(_ENTRY, {"id": reservation_id}).one_or_none()
        if row is None or row.queued_at is None:
            return None
        return Entry(row.priority, _aware(row.queued_at), row.ttl_ms)

    def ahead_of(self, partition: str, reservation_id: str, entry: Entry) -> int:
        """How many waiting requests of ``partition`` come before this one in grant order."""
        params = {"p": partition, "pr": entry.priority, "at": _naive(entry.queued_at), "id": reservation_id}
        return int(self.conn.execute(_AHEAD, params).scalar_one())

    def has_line(self, partition: str) -> bool:
        """Whether ``partition`` has a waiting request."""
        return self.conn.execute(_HAS_LINE, {"p": partition}).first() is not None

    def grant_waiting(self, reservation_id: str, now: datetime, expires_at: datetime) -> int:
        """``waiting -> pending`` of a row this transaction holds, made at ``now``; 1 if it was
        waiting, else 0."""
        params = {"rid": reservation_id, "now": _naive(now), "expires": _naive(expires_at)}
        return self.conn.execute(_GRANT, params).rowcount

    def leave_line(self, ids: Sequence[str], state: str, now: datetime) -> int:
        """``waiting -> state`` (``rolled_back``, ``expired``) of rows this transaction holds;
        how many were waiting."""
        if not ids:
            return 0
        return self.conn.execute(_LEAVE, {"ids": list(ids), "new_state": state, "now": _naive(now)}).rowcount


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)


def _naive(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
