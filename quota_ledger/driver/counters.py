"""Queue and subtree counters (``quota_usages``): steps 5 and 6 of the lock order in :mod:`.tx`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    Connection,
    Table,
    and_,
    bindparam,
    delete,
    exists,
    or_,
    select,
    update,
)
from sqlalchemy import insert as sa_insert

from quota_ledger.driver import dialect, inline
from quota_ledger.driver.pg_cursor import PgCursor
from quota_ledger.driver.schema import quota_partitions, quota_usages
from quota_ledger.model.charges import CounterKey
from quota_ledger.model.counters import QUEUE, SUBTREE, Counter
from quota_ledger.model.queues import subtree_bounds


def force_index(stmt: Any, table: Table, index: str) -> Any:
    """MariaDB locks rows in the order it scans them, and on a small table it prefers a full
    scan in primary-key order, which would break the canonical order (and lock rows that do not
    match). Forcing the unique index makes it scan, and lock, in that index's order."""
    for name in ("mysql", "mariadb"):
        stmt = stmt.with_hint(table, f"FORCE INDEX ({index})", dialect_name=name)
    return stmt


_U = quota_usages.c
_COUNTER_INDEX = "uq_quota_usages_partition_scope_type_scope_resource"


def _in_index_order(stmt: Any) -> Any:
    return force_index(stmt, quota_usages, _COUNTER_INDEX)


_COUNTER_COLUMNS = (_U.id, _U.scope_type, _U.scope, _U.resource, _U.in_use, _U.reserved, _U.hard_limit)
_PG_COUNTER = "id, scope_type, scope, resource, in_use, reserved, hard_limit"

# lock_queue_counters: locks queue counters of the given queues x resources (step 5).
_LOCK_QUEUE = (
    _in_index_order(select(*_COUNTER_COLUMNS))
    .where(
        _U.partition == bindparam("p"),
        _U.scope_type == QUEUE,
        _U.scope.in_(bindparam("scopes", expanding=True)),
        _U.resource.in_(bindparam("resources", expanding=True)),
    )
    .order_by(_U.scope, _U.resource)
    .with_for_update()
)
PG_LOCK_QUEUE = (
    f"SELECT {_PG_COUNTER} FROM quota_usages WHERE \"partition\" = %(p)s AND scope_type = 'queue'"  # noqa: S608
    " AND scope = ANY(%(scopes)s) AND resource = ANY(%(resources)s)"
    " ORDER BY scope, resource FOR UPDATE"
)
# read_subtree_counters: the limits on the given scopes x resources; no lock (a pre-check only).
_READ_SUBTREE = (
    select(*_COUNTER_COLUMNS)
    .where(
        _U.partition == bindparam("p"),
        _U.scope_type == SUBTREE,
        _U.scope.in_(bindparam("scopes", expanding=True)),
        _U.resource.in_(bindparam("resources", expanding=True)),
    )
    .order_by(_U.scope, _U.resource)
)
# lock_subtree_counters: locks the limits on the given scopes x resources (step 6).
_LOCK_SUBTREE = _in_index_order(_READ_SUBTREE).with_for_update()
PG_LOCK_SUBTREE = (
    f"SELECT {_PG_COUNTER} FROM quota_usages WHERE \"partition\" = %(p)s AND scope_type = 'subtree'"  # noqa: S608
    " AND scope = ANY(%(scopes)s) AND resource = ANY(%(resources)s)"
    " ORDER BY scope, resource FOR UPDATE"
)
_SUBTREE_RANGE = or_(
    _U.scope == bindparam("q"), and_(_U.scope >= bindparam("lo"), _U.scope < bindparam("hi"))
)
# lock_queue_counters_below: locks every queue counter of a queue's subtree for one resource
# (step 5, used by limit changes under the exclusive partition lock).
_LOCK_QUEUE_BELOW = (
    _in_index_order(select(*_COUNTER_COLUMNS))
    .where(
        _U.partition == bindparam("p"),
        _U.scope_type == QUEUE,
        _U.resource.in_(bindparam("resources", expanding=True)),
        _SUBTREE_RANGE,
    )
    .order_by(_U.scope, _U.resource)
    .with_for_update()
)
# usage_rows: the queue's limits and every queue counter below it, one snapshot; no lock.
_USAGE_ROWS = select(*_COUNTER_COLUMNS).where(
    _U.partition == bindparam("p"),
    or_(
        and_(_U.scope_type == SUBTREE, _U.scope == bindparam("q")),
        and_(_U.scope_type == QUEUE, _SUBTREE_RANGE),
    ),
)
# subtree_limits: the limits set on a queue; no lock (admin holds the partition lock).
_LIMITS_AT = select(*_COUNTER_COLUMNS).where(
    _U.partition == bindparam("p"), _U.scope_type == SUBTREE, _U.scope == bindparam("q")
)
# lock_limits_at: locks the limits set on one queue for the given resources (step 6; limit
# changes under the exclusive partition lock). Equality on the scope keeps it an index range
# whatever the statistics say (a list of scopes may be planned as a scan of every limit).
_LOCK_LIMITS_AT = (
    _in_index_order(select(*_COUNTER_COLUMNS))
    .where(
        _U.partition == bindparam("p"),
        _U.scope_type == SUBTREE,
        _U.scope == bindparam("q"),
        _U.resource.in_(bindparam("resources", expanding=True)),
    )
    .order_by(_U.resource)
    .with_for_update()
)
# apply_counter_deltas: adds to counters this transaction has locked (see add_to_locked).
PG_APPLY = (
    "UPDATE quota_usages SET in_use = quota_usages.in_use + d.di,"
    " reserved = quota_usages.reserved + d.dr, updated_at = %(now)s"
    " FROM unnest(%(ids)s::bigint[], %(dis)s::bigint[], %(drs)s::bigint[]) AS d(id, di, dr)"
    " WHERE quota_usages.id = d.id"
)
_SET_COUNTER = (
    update(quota_usages)
    .where(_U.id == bindparam("cid"))
    .values(in_use=bindparam("v_in_use"), reserved=bindparam("v_reserved"), updated_at=bindparam("now"))
)
_SET_LIMIT = (
    update(quota_usages)
    .where(_U.id == bindparam("cid"))
    .values(hard_limit=bindparam("lim"), updated_at=bindparam("now"))
)
_DELETE_COUNTER = delete(quota_usages).where(_U.id == bindparam("cid"))
_INSERT_COUNTER = sa_insert(quota_usages)

# lock_all_counters: locks every counter of one type in a partition (audit --fix, steps 5/6).
_LOCK_ALL = (
    _in_index_order(select(*_COUNTER_COLUMNS))
    .where(_U.partition == bindparam("p"), _U.scope_type == bindparam("st"))
    .order_by(_U.scope, _U.resource)
    .with_for_update()
)
# all_limits: every subtree counter of a partition; no lock.
_ALL_LIMITS = (
    select(*_COUNTER_COLUMNS)
    .where(_U.partition == bindparam("p"), _U.scope_type == SUBTREE)
    .order_by(_U.scope, _U.resource)
)
# all_counters: every counter of a partition; no lock (audit reads in one snapshot).
_ALL_COUNTERS = (
    select(*_COUNTER_COLUMNS)
    .where(_U.partition == bindparam("p"))
    .order_by(_U.scope_type, _U.scope, _U.resource)
)
# resource_names: the distinct resources a partition's counters name; no lock (a bound, read
# when a reservation is about to create counters).
_RESOURCE_NAMES = select(_U.resource).where(_U.partition == bindparam("p")).distinct()
#: scopes one lock_subtree_counters statement names at most (SQLite, MariaDB): the lineages of a
#: batch of reservations on deep queues are tens of thousands, over SQLite's 32,766 parameters.
#: More take one statement per slice of the sorted scopes, which keeps the canonical order.
SCOPE_SLICE = 2048
#: resources one unnamed_resources statement asks about at most: one result column each, and
#: SQLite returns 2,000 at most, PostgreSQL 1,664
NAMES_SLICE = 256


@lru_cache(maxsize=64)
def _names_resources(count: int) -> Any:
    """named_resources of ``count`` resources: one EXISTS each (the scan of the partition's
    counters stops at the first that names it); no lock."""
    return select(
        *(
            exists()
            .where(_U.partition == bindparam("p"), _U.resource == bindparam(f"r{i}"))
            .label(f"named{i}")
            for i in range(count)
        )
    )


#: ``Connection.info`` key: the queue counters (partition, queue, resource) the connection's
#: transaction holds locked (:class:`~quota_ledger.driver.tx.LedgerTx` starts it empty); dropped
#: when the transaction rolls back to a savepoint (:func:`forget_held`)
HELD = "quota_ledger.held_counters"


def forget_held(conn: Connection, _name: object, _context: object) -> None:
    """A ``rollback_savepoint`` listener of the driver's engines: the locks taken since the
    savepoint are let go, so the transaction no longer knows which counters it holds."""
    conn.info.pop(HELD, None)


class CounterStatements:
    """The statements above, as methods of :class:`~quota_ledger.driver.tx.LedgerTx`."""

    conn: Connection
    backend: str
    pg: PgCursor | None
    deferred: list[inline.Statement] | None
    #: the queues' own counters this transaction locked: they limit nothing (see ``freed``)
    own_counters: set[CounterKey]

    def lock_queue_counters(
        self, partition: str, pairs: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], Counter]:
        """Lock the queue counters of ``pairs`` (queue, resource), in canonical order; those
        that do not exist are missing from the result."""
        wanted = set(pairs)
        if not wanted:
            return {}
        scopes = sorted({q for q, _ in wanted})
        resources = sorted({r for _, r in wanted})
        params = {"p": partition, "scopes": scopes, "resources": resources}
        if self.pg is not None:
            rows: Sequence[Any] = self.pg.all(PG_LOCK_QUEUE, params)
        else:
            rows = self.conn.execute(_LOCK_QUEUE, params).all()
        found = {(row.scope, row.resource): _counter(row) for row in rows}
        self.own_counters.update(("usages", counter.id) for counter in found.values())
        held = self.conn.info.get(HELD)
        if held is not None:
            held.update((partition, scope, resource) for scope, resource in found)
        return {pair: counter for pair, counter in found.items() if pair in wanted}

    def holds_queue_counters(self, partition: str, pairs: Iterable[tuple[str, str]]) -> bool:
        """Whether this transaction holds the queue counters of ``pairs`` locked (they exist),
        as far as it knows: it locked them and has not rolled back to a savepoint since."""
        held = self.conn.info.get(HELD)
        return held is not None and all((partition, q, r) in held for q, r in pairs)

    def lock_subtree_counters(
        self, partition: str, scopes: Iterable[str], resources: Iterable[str], *, lock: bool = True
    ) -> list[Counter]:
        """Lock the limits set on ``scopes`` for ``resources``, in canonical order."""
        scopes, resources = sorted(set(scopes)), sorted(set(resources))
        if not scopes or not resources:
            return []
        if self.pg is not None and lock:  # arrays: one statement whatever their length
            params = {"p": partition, "scopes": scopes, "resources": resources}
            return [_counter(row) for row in self.pg.all(PG_LOCK_SUBTREE, params)]
        found: list[Counter] = []
        for start in range(0, len(scopes), SCOPE_SLICE):
            params = {"p": partition, "scopes": scopes[start : start + SCOPE_SLICE], "resources": resources}
            found += [
                _counter(row) for row in self.conn.execute(_LOCK_SUBTREE if lock else _READ_SUBTREE, params)
            ]
        return found

    def lock_queue_counters_below(
        self, partition: str, queue: str, resources: Iterable[str]
    ) -> list[Counter]:
        """Lock every queue counter in ``queue``'s subtree for ``resources``."""
        resources = sorted(set(resources))
        if not resources:
            return []
        lo, hi = subtree_bounds(queue)
        rows = self.conn.execute(
            _LOCK_QUEUE_BELOW, {"p": partition, "q": queue, "lo": lo, "hi": hi, "resources": resources}
        ).all()
        return [_counter(row) for row in rows]

    def lock_limits_at(self, partition: str, queue: str, resources: Iterable[str]) -> list[Counter]:
        """Lock the limits set on ``queue`` for ``resources``, in canonical order."""
        resources = sorted(set(resources))
        if not resources:
            return []
        rows = self.conn.execute(_LOCK_LIMITS_AT, {"p": partition, "q": queue, "resources": resources})
        return [_counter(row) for row in rows]

    def limits_at(self, partition: str, queue: str) -> list[Counter]:
        return [_counter(r) for r in self.conn.execute(_LIMITS_AT, {"p": partition, "q": queue})]

    def usage_rows(self, partition: str, queue: str) -> list[Counter]:
        lo, hi = subtree_bounds(queue)
        rows = self.conn.execute(_USAGE_ROWS, {"p": partition, "q": queue, "lo": lo, "hi": hi})
        return [_counter(row) for row in rows]

    def apply_counter_deltas(self, deltas: Mapping[int, tuple[int, int]], now: datetime) -> None:
        """Add ``(d_in_use, d_reserved)`` to each locked counter id (in id order)."""
        changes = sorted((cid, d) for cid, d in deltas.items() if d[0] or d[1])
        if not changes:
            return
        if self.pg is not None:
            self.pg.run(
                PG_APPLY,
                {
                    "ids": [cid for cid, _ in changes],
                    "dis": [d[0] for _, d in changes],
                    "drs": [d[1] for _, d in changes],
                    "now": now,
                },
            )
            return
        inline.write(self.conn, self.deferred, inline.add_to_locked(self.conn, quota_usages, changes, now))

    def set_counter_values(self, values: Mapping[int, tuple[int, int]], now: datetime) -> None:
        params = [
            {"cid": cid, "v_in_use": in_use, "v_reserved": reserved, "now": now}
            for cid, (in_use, reserved) in sorted(values.items())
        ]
        if params:
            self.conn.execute(_SET_COUNTER, params)

    def insert_subtree_counter(
        self,
        partition: str,
        queue: str,
        resource: str,
        *,
        in_use: int,
        reserved: int,
        limit: int,
        now: datetime,
    ) -> None:
        self.conn.execute(
            _INSERT_COUNTER,
            {
                "partition": partition,
                "scope_type": SUBTREE,
                "scope": queue,
                "resource": resource,
                "in_use": in_use,
                "reserved": reserved,
                "hard_limit": limit,
                "updated_at": now,
            },
        )

    def set_limit(self, counter_id: int, limit: int, now: datetime) -> None:
        self.conn.execute(_SET_LIMIT, {"cid": counter_id, "lim": limit, "now": now})

    def delete_counter(self, counter_id: int) -> None:
        self.conn.execute(_DELETE_COUNTER, {"cid": counter_id})

    def create_missing(self, partition: str, pairs: Sequence[tuple[str, str]], now: datetime) -> None:
        """Create the partition row and zeroed queue counters, skipping those that exist."""
        self.conn.execute(
            dialect.insert_ignoring_duplicates(self.backend, quota_partitions),
            {"name": partition, "created_at": now},
        )
        self.insert_queue_counters(partition, pairs, now)

    def insert_queue_counters(self, partition: str, pairs: Sequence[tuple[str, str]], now: datetime) -> None:
        """Create zeroed queue counters, skipping those that exist (a concurrent inserter of
        the same counter is waited for). The partition row is left alone: a reservation holds
        it shared, and on MariaDB writing it would take it exclusively."""
        if pairs:
            self.conn.execute(
                dialect.insert_ignoring_duplicates(self.backend, quota_usages),
                [
                    {
                        "partition": partition,
                        "scope_type": QUEUE,
                        "scope": queue,
                        "resource": resource,
                        "in_use": 0,
                        "reserved": 0,
                        "hard_limit": None,
                        "updated_at": now,
                    }
                    for queue, resource in sorted(pairs)
                ],
            )

    def lock_all_counters(self, partition: str, scope_type: str) -> list[Counter]:
        """Lock every counter of one type in a partition, in canonical order."""
        rows = self.conn.execute(_LOCK_ALL, {"p": partition, "st": scope_type})
        return [_counter(row) for row in rows]

    def all_limits(self, partition: str) -> list[Counter]:
        return [_counter(row) for row in self.conn.execute(_ALL_LIMITS, {"p": partition})]

    def all_counters(self, partition: str) -> list[Counter]:
        return [_counter(row) for row in self.conn.execute(_ALL_COUNTERS, {"p": partition})]

    def resource_names(self, partition: str) -> set[str]:
        """The distinct resource names the partition's counters name."""
        return {row.resource for row in self.conn.execute(_RESOURCE_NAMES, {"p": partition})}

    def unnamed_resources(self, partition: str, resources: Iterable[str]) -> set[str]:
        """Those of ``resources`` that no counter of the partition names yet."""
        wanted = sorted(set(resources))
        unnamed: set[str] = set()
        for start in range(0, len(wanted), NAMES_SLICE):
            part = wanted[start : start + NAMES_SLICE]
            params = {"p": partition, **{f"r{i}": name for i, name in enumerate(part)}}
            row = self.conn.execute(_names_resources(len(part)), params).one()
            unnamed |= {name for name, named in zip(part, row, strict=True) if not named}
        return unnamed


def _counter(row: Any) -> Counter:
    return Counter(
        id=row.id,
        scope_type=row.scope_type,
        scope=row.scope,
        resource=row.resource,
        in_use=row.in_use,
        reserved=row.reserved,
        limit=row.hard_limit,
    )
