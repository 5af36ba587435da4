"""The journal (``quota_journal``): every change to a counter's ``in_use``, with the operation
that made it. New rows only, so it takes no lock; audit sums it (and the pending reservations)
to say what the counters must hold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, func, select

from quota_ledger.driver import inline
from quota_ledger.driver.pg_cursor import PgCursor
from quota_ledger.driver.schema import quota_journal, reservation_items, reservations
from quota_ledger.model import drift

_J = quota_journal.c
_R = reservations.c
_I = reservation_items.c

# append_journal: new rows only; on PostgreSQL one change (the rows that share the columns of
# _CHANGE) per statement.
_CHANGE = ("partition", "queue", "kind", "reservation_id", "operation_id", "created_at")
PG_INSERT_JOURNAL = (
    'INSERT INTO quota_journal ("partition", queue, resource, delta, kind, reservation_id,'
    " operation_id, created_at)"
    " SELECT %(p)s, %(q)s, t.resource, t.delta, %(kind)s, %(rid)s, %(op)s, %(now)s"
    " FROM unnest(%(resources)s::text[], %(deltas)s::bigint[]) AS t(resource, delta)"
)
# operation_recorded: did an earlier attempt of this call already commit? no lock.
_OPERATION_RECORDED = select(_J.id).where(_J.operation_id == bindparam("op")).limit(1)
# operation_changes: what one operation changed, per (queue, resource); no lock (run after the
# caller locked what a twin operation would lock, so a committed twin is seen).
_OPERATION_CHANGES = (
    select(_J.queue, _J.resource, func.sum(_J.delta).label("total"))
    .where(_J.operation_id == bindparam("op"))
    .group_by(_J.queue, _J.resource)
)

# -- audit (no locks; read in one snapshot or under the exclusive partition lock) -------------
_JOURNAL_SUMS = (
    select(_J.queue, _J.resource, func.sum(_J.delta).label("total"))
    .where(_J.partition == bindparam("p"))
    .group_by(_J.queue, _J.resource)
)
_PENDING_SUMS = (
    select(_R.queue, _I.resource, func.sum(_I.amount).label("total"))
    .select_from(reservations.join(reservation_items, _I.reservation_id == _R.id))
    .where(_R.partition == bindparam("p"), _R.state == "pending")
    .group_by(_R.queue, _I.resource)
)
# reservation_journal: the journal's totals per reservation, kind and resource; no lock.
_RESERVATION_JOURNAL = (
    select(_J.reservation_id, _J.queue, _J.kind, _J.resource, func.sum(_J.delta).label("total"))
    .where(_J.partition == bindparam("p"), _J.reservation_id.is_not(None))
    .group_by(_J.reservation_id, _J.queue, _J.kind, _J.resource)
)
# committed_reservations: what committed reservations committed, and whether released; no lock.
_COMMITTED = (
    select(_R.id, _R.queue, _R.released_at, _I.resource, _I.committed)
    .select_from(reservations.join(reservation_items, _I.reservation_id == _R.id))
    .where(_R.partition == bindparam("p"), _R.state == "committed", _I.committed > 0)
)


class JournalStatements:
    """The statements above, as methods of :class:`~quota_ledger.driver.tx.LedgerTx`."""

    conn: Connection
    pg: PgCursor | None
    deferred: list[inline.Statement] | None

    def append_journal(
        self,
        partition: str,
        queue: str,
        deltas: Mapping[str, int],
        *,
        kind: str,
        operation_id: str,
        reservation_id: str | None,
        now: datetime,
    ) -> None:
        self.append_journal_rows(
            journal_rows(
                partition,
                queue,
                deltas,
                kind=kind,
                operation_id=operation_id,
                reservation_id=reservation_id,
                now=now,
            )
        )

    def append_journal_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append journal rows (each a ``quota_journal`` row without its id): on MariaDB and
        SQLite with one multi-row insert, on PostgreSQL with one insert for the rows of each
        change (of one reservation, operation and queue)."""
        if not rows:
            return
        if self.pg is None:
            inline.write(self.conn, self.deferred, [inline.insert_rows(self.conn, quota_journal, rows)])
            return
        changes: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
        for row in rows:
            changes.setdefault(tuple(row[name] for name in _CHANGE), []).append(row)
        for change, mine in changes.items():
            params = dict(zip(("p", "q", "kind", "rid", "op", "now"), change, strict=True))
            params.update(resources=[row["resource"] for row in mine], deltas=[row["delta"] for row in mine])
            self.pg.run(PG_INSERT_JOURNAL, params)

    def operation_recorded(self, operation_id: str) -> bool:
        return self.conn.execute(_OPERATION_RECORDED, {"op": operation_id}).first() is not None

    def operation_changes(self, operation_id: str) -> dict[tuple[str, str], int]:
        """SUM(delta) per (queue, resource) of one operation's journal entries (empty: none)."""
        rows = self.conn.execute(_OPERATION_CHANGES, {"op": operation_id})
        return {(row.queue, row.resource): int(row.total) for row in rows}

    def journal_sums(self, partition: str) -> dict[tuple[str, str], int]:
        """SUM(delta) of the journal per (queue, resource): what in_use must be."""
        rows = self.conn.execute(_JOURNAL_SUMS, {"p": partition})
        return {(row.queue, row.resource): int(row.total) for row in rows}

    def pending_sums(self, partition: str) -> dict[tuple[str, str], int]:
        """SUM(amount) of pending reservations per (queue, resource): what reserved must be."""
        rows = self.conn.execute(_PENDING_SUMS, {"p": partition})
        return {(row.queue, row.resource): int(row.total) for row in rows}

    def reservation_journal(self, partition: str) -> tuple[dict[tuple[str, str, str], int], dict[str, str]]:
        """The journal's totals per (reservation, kind, resource), released amounts counted
        positive, and the queue of each reservation it names."""
        sums: dict[tuple[str, str, str], int] = {}
        queues: dict[str, str] = {}
        for row in self.conn.execute(_RESERVATION_JOURNAL, {"p": partition}):
            total = int(row.total)
            key = (row.reservation_id, row.kind, row.resource)
            sums[key] = sums.get(key, 0) + (-total if row.kind == drift.RELEASE else total)
            queues[row.reservation_id] = row.queue
        return sums, queues

    def committed_reservations(self, partition: str) -> list[drift.Settled]:
        """Every committed reservation of ``partition``: its committed amounts, and whether it
        was released."""
        found: dict[str, tuple[str, bool, dict[str, int]]] = {}
        for row in self.conn.execute(_COMMITTED, {"p": partition}):
            _, _, amounts = found.setdefault(row.id, (row.queue, row.released_at is not None, {}))
            amounts[row.resource] = int(row.committed)
        return [
            drift.Settled(reservation_id=rid, queue=queue, committed=amounts, released=released)
            for rid, (queue, released, amounts) in found.items()
        ]


def journal_rows(
    partition: str,
    queue: str,
    deltas: Mapping[str, int],
    *,
    kind: str,
    operation_id: str,
    reservation_id: str | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """The ``quota_journal`` rows (without their ids) of one change of a queue's ``in_use``:
    one per resource whose delta is not zero."""
    return [
        {
            "partition": partition,
            "queue": queue,
            "resource": resource,
            "delta": delta,
            "kind": kind,
            "reservation_id": reservation_id,
            "operation_id": operation_id,
            "created_at": now,
        }
        for resource, delta in deltas.items()
        if delta != 0
    ]
