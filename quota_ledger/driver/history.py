"""Read-only statements behind the usage history: how a queue's subtree changed, step by step.

No time-series store: in-use changes are the journal's rows, reserved changes are reservations
being made and resolved. Each statement groups the rows of one window by step in the database,
so a reader gets at most (resources x steps) rows back however busy the ledger was, and each
reads only the window's rows through an index:

- ``ix_quota_journal_partition_created_at`` for the journal;
- ``ix_reservations_partition_resolved_at`` (resolved rows only, where the engine has partial
  indexes) for reservations resolved in the window;
- the pending index ``ix_reservations_partition_queue_state_expires_at`` for those still pending.

A reservation made in the window is either still pending or was resolved in it, so the last
two find every one. No statement takes a lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    Integer,
    Select,
    and_,
    bindparam,
    func,
    or_,
    select,
)

from quota_ledger.driver import dialect
from quota_ledger.driver.schema import PENDING, quota_journal, reservation_items, reservations
from quota_ledger.model.queues import subtree_bounds

_J = quota_journal.c
_R = reservations.c
_I = reservation_items.c
_SINCE = bindparam("since", type_=DateTime())
_STEP = bindparam("step", type_=Integer())


def _in_subtree(column: ColumnElement[str]) -> ColumnElement[bool]:
    """The queue itself or anything below it (the range of ``queues.subtree_bounds``)."""
    return or_(column == bindparam("q"), and_(column >= bindparam("lo"), column < bindparam("hi")))


def _by_step(inner: Select[tuple[str, int, int]]) -> Select[tuple[str, int, int]]:
    # Grouped in an outer query: PostgreSQL would not match a GROUP BY expression holding bound
    # parameters against the same expression in the select list.
    rows = inner.subquery()
    return select(rows.c.resource, rows.c.step, func.sum(rows.c.amount).label("total")).group_by(
        rows.c.resource, rows.c.step
    )


# history_in_use: journal deltas of the subtree since the window's start, summed per step.
_JOURNAL_STEPS = _by_step(
    select(
        _J.resource,
        dialect.time_bucket(_J.created_at, _SINCE, _STEP).label("step"),
        _J.delta.label("amount"),
    ).where(
        _J.partition == bindparam("p"),
        _J.created_at >= _SINCE,
        _in_subtree(_J.queue),
    )
)
_ITEMS = reservations.join(reservation_items, _I.reservation_id == _R.id)
# history_made_pending: amounts of reservations made in the window and still pending, per step.
_MADE_PENDING = _by_step(
    select(
        _I.resource,
        dialect.time_bucket(_R.created_at, _SINCE, _STEP).label("step"),
        _I.amount.label("amount"),
    )
    .select_from(_ITEMS)
    .where(
        _R.partition == bindparam("p"),
        _R.state == PENDING,
        _in_subtree(_R.queue),
        _R.created_at >= _SINCE,
    )
)
# history_made_resolved: amounts of reservations made and resolved in the window, per step made.
_MADE_RESOLVED = _by_step(
    select(
        _I.resource,
        dialect.time_bucket(_R.created_at, _SINCE, _STEP).label("step"),
        _I.amount.label("amount"),
    )
    .select_from(_ITEMS)
    .where(
        _R.partition == bindparam("p"),
        _R.resolved_at >= _SINCE,
        _in_subtree(_R.queue),
        _R.created_at >= _SINCE,
        _R.ttl_ms.is_(None),  # a request that left the line ungranted held nothing
    )
)
# history_resolved: amounts of reservations resolved in the window (whenever made), per step.
_RESOLVED = _by_step(
    select(
        _I.resource,
        dialect.time_bucket(_R.resolved_at, _SINCE, _STEP).label("step"),
        _I.amount.label("amount"),
    )
    .select_from(_ITEMS)
    .where(
        _R.partition == bindparam("p"),
        _R.resolved_at >= _SINCE,
        _in_subtree(_R.queue),
        _R.ttl_ms.is_(None),
    )
)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepChanges:
    """How a subtree's counters changed in each step of a window, per (resource, step)."""

    #: the sum of the journal's deltas: in-use usage committed minus released
    in_use: dict[tuple[str, int], int]
    #: amounts reserved minus amounts resolved (committed, rolled back or expired)
    reserved: dict[tuple[str, int], int]


def step_changes(conn: Connection, partition: str, queue: str, since: datetime, step: int) -> StepChanges:
    """The changes of ``queue``'s subtree from ``since`` (naive UTC) on, in steps of ``step`` s."""
    lo, hi = subtree_bounds(queue)
    params = {"p": partition, "q": queue, "lo": lo, "hi": hi, "since": since, "step": step}
    in_use: dict[tuple[str, int], int] = {}
    reserved: dict[tuple[str, int], int] = {}
    for statement, into, sign in (
        (_JOURNAL_STEPS, in_use, 1),
        (_MADE_PENDING, reserved, 1),
        (_MADE_RESOLVED, reserved, 1),
        (_RESOLVED, reserved, -1),
    ):
        for row in conn.execute(statement, params):
            key = (str(row.resource), int(row.step))
            into[key] = into.get(key, 0) + sign * int(row.total)
    return StepChanges(in_use=in_use, reserved=reserved)
