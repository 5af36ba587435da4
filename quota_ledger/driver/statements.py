"""Every SQL statement the ledger runs, each named, each saying what it locks.

Canonical lock order, the same on every path, so there are no deadlocks by design:

1. the partition lock (reserve takes it shared; limit changes and ``audit --fix`` exclusively),
2. reservation rows (commit, rollback and the sweeper, which skips rows already locked),
3. ``queue`` counters, sorted by (scope, resource),
4. ``subtree`` counters, sorted by (scope, resource), read by a *separate* statement so that
   a subtree row created while we waited for step 3 is seen (READ COMMITTED re-reads),
New rows (a reservation's header, items, journal entries) may be written at any point: nobody
else can wait for a row not yet committed. Reserve and commit write theirs *before* locking the
counters, so the shared counters are held only for check, update and commit.

Only reserve can create ``queue`` counters, and only under the shared partition lock, so a
limit change holding the exclusive lock sees every counter it has to sum (no phantoms).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    and_,
    bindparam,
    delete,
    func,
    or_,
    select,
    update,
)
from sqlalchemy import insert as sa_insert

from quota_ledger.driver import dialect
from quota_ledger.driver.pg_fast import FastPath
from quota_ledger.driver.schema import (
    PENDING,
    quota_journal,
    quota_partitions,
    quota_usages,
    reservation_items,
    reservations,
)
from quota_ledger.driver.tracking import TrackingStatements
from quota_ledger.model.limits import QUEUE, SUBTREE, Counter
from quota_ledger.model.queues import subtree_bounds
from quota_ledger.model.values import Reservation, ReservationState, StoredReservation


class MissingCounters(Exception):
    """Internal: counters must be created (in their own transaction) before locking.

    ``pairs`` are (queue, resource) queue counters; ``identity`` are (kind, name, queue,
    resource) user/group counters, which the engine creates (their limits are policy).
    """

    def __init__(
        self,
        partition: str,
        pairs: Sequence[tuple[str, str]],
        *,
        identity: Sequence[tuple[str, str, str, str]] = (),
    ) -> None:
        self.partition = partition
        self.pairs = list(pairs)
        self.identity = list(identity)
        super().__init__(f"missing counters in {partition}: {pairs} {identity}")


_U = quota_usages.c
_R = reservations.c
_I = reservation_items.c
_J = quota_journal.c
# MariaDB locks rows in the order it scans them, and on a small table it prefers a full scan
# in primary-key order, which would break the canonical order (and lock rows that do not
# match). Forcing the unique counter index makes it scan, and lock, in (scope, resource) order.
_COUNTER_INDEX = "FORCE INDEX (uq_quota_usages_partition_scope_type_scope_resource)"


def _in_index_order(stmt: Any) -> Any:
    for name in ("mysql", "mariadb"):
        stmt = stmt.with_hint(quota_usages, _COUNTER_INDEX, dialect_name=name)
    return stmt


_COUNTER_COLUMNS = (_U.id, _U.scope_type, _U.scope, _U.resource, _U.in_use, _U.reserved, _U.hard_limit)

# -- partition ---------------------------------------------------------------------------------
# lock_partition_*: MariaDB/SQLite form; locks the partition row (shared or exclusive).
_LOCK_PARTITION_ROW = select(dialect.utcnow()).where(quota_partitions.c.name == bindparam("p"))
# lock_partition_* on PostgreSQL: a transaction-scoped advisory lock; no row is written.
_PG_LOCK_EXCLUSIVE = select(func.pg_advisory_xact_lock(bindparam("ns"), bindparam("k")), dialect.utcnow())
# db_now: the database clock; no lock.
_DB_NOW = select(dialect.utcnow())

# -- reservations ------------------------------------------------------------------------------
_HEADER = (
    _R.id,
    _R.partition,
    _R.key,
    _R.request_hash,
    _R.state,
    _R.queue,
    _R.user_name,
    _R.groups,
    _R.application,
    _R.priority_class,
    _R.created_at,
    _R.expires_at,
    _R.resolved_at,
    _R.kube,
    _R.released_at,
)
_ITEM = (_I.resource, _I.amount, _I.committed)
_JOINED = reservations.outerjoin(reservation_items, _I.reservation_id == _R.id)
# find_reservation_by_key: no lock (idempotency check before any lock is taken).
_FIND_BY_KEY = (
    select(*_HEADER, *_ITEM)
    .select_from(_JOINED)
    .where(_R.partition == bindparam("p"), _R.key == bindparam("key"))
)
# find_reservation: no lock.
_FIND_BY_ID = select(*_HEADER, *_ITEM).select_from(_JOINED).where(_R.id == bindparam("id"))
# lock_reservation: locks the reservation header row (step 2) and reads the clock.
_LOCK_BY_ID = (
    select(*_HEADER, *_ITEM, dialect.utcnow().label("db_now"))
    .select_from(_JOINED)
    .where(_R.id == bindparam("id"))
    .with_for_update(of=reservations)
)
# lock_expired: locks up to :n expired pending reservations, skipping rows others hold (step 2).
# :now is bound (read from the database first): a volatile clock call here would keep PostgreSQL
# from using the (partition, state, expires_at) index.
_EXPIRED_IDS = (
    select(_R.id)
    .where(_R.partition == bindparam("p"), _R.state == PENDING, _R.expires_at <= bindparam("now"))
    .order_by(_R.expires_at)
    .limit(bindparam("n", type_=Integer))
)
_LOCK_EXPIRED_IDS = _EXPIRED_IDS.with_for_update(skip_locked=True)
# MariaDB keeps its locks on index entries it skipped through the secondary index, which lets
# a sweep block a commit; there the candidates are read without locks, then locked by key.
_LOCK_IDS_IF_PENDING = (
    select(_R.id)
    .where(_R.id.in_(bindparam("ids", expanding=True)), _R.state == "pending")
    .order_by(_R.id)
    .with_for_update(skip_locked=True)
)
# read_reservations: headers and items of rows this transaction already locked; no new lock.
_READ_MANY = select(*_HEADER, *_ITEM).select_from(_JOINED).where(_R.id.in_(bindparam("ids", expanding=True)))
_INSERT_HEADER = sa_insert(reservations)
_INSERT_ITEMS = sa_insert(reservation_items)
# resolve_reservation: conditional state change on a row we hold; rowcount tells if it applied.
_RESOLVE = (
    update(reservations)
    .where(_R.id == bindparam("rid"), _R.state == "pending")
    .values(state=bindparam("new_state"), resolved_at=bindparam("now"))
)
_EXPIRE_MANY = (
    update(reservations)
    .where(_R.id.in_(bindparam("ids", expanding=True)), _R.state == "pending")
    .values(state="expired", resolved_at=bindparam("now"))
)
# record_commits for a full commit: every item committed in full, one statement.
_COMMIT_ALL_ITEMS = (
    update(reservation_items).where(_I.reservation_id == bindparam("rid")).values(committed=_I.amount)
)
_SET_COMMITTED = (
    update(reservation_items)
    .where(_I.reservation_id == bindparam("rid"), _I.resource == bindparam("res"))
    .values(committed=bindparam("v_committed"))
)

# -- counters ----------------------------------------------------------------------------------
# lock_queue_counters: locks queue counters of the given queues x resources (step 3).
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
# lock_subtree_counters: locks the limits on the given scopes x resources (step 4).
_LOCK_SUBTREE = _in_index_order(_READ_SUBTREE).with_for_update()
_SUBTREE_RANGE = or_(
    _U.scope == bindparam("q"), and_(_U.scope >= bindparam("lo"), _U.scope < bindparam("hi"))
)
# lock_queue_counters_below: locks every queue counter of a queue's subtree for one resource
# (step 3, used by limit changes under the exclusive partition lock).
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
# apply_counter_deltas: adds to counters this transaction has locked.
_APPLY = (
    update(quota_usages)
    .where(_U.id == bindparam("cid"))
    .values(
        in_use=_U.in_use + bindparam("d_in_use"),
        reserved=_U.reserved + bindparam("d_reserved"),
        updated_at=bindparam("now"),
    )
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

# lock_all_counters: locks every counter of one type in a partition (audit --fix, steps 3/4).
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

# -- journal -----------------------------------------------------------------------------------
_INSERT_JOURNAL = sa_insert(quota_journal)
# operation_recorded: did an earlier attempt of this call already commit? no lock.
_OPERATION_RECORDED = select(_J.id).where(_J.operation_id == bindparam("op")).limit(1)


class LedgerTx(TrackingStatements):
    """One database transaction of the ledger. The engine decides; this class reads and writes."""

    def __init__(self, conn: Connection, backend: str, attempt: int) -> None:
        self.conn = conn
        self.backend = backend
        #: 0 on the first try; a retry after a lost connection checks what already happened
        self.attempt = attempt
        #: run by the driver once this transaction has committed (never for a failed attempt)
        self.after_commit: list[Callable[[], None]] = []
        #: PostgreSQL runs the hot statements on the psycopg cursor (see pg_fast)
        self.fast = FastPath(conn) if backend == "postgresql" else None

    # -- partition -------------------------------------------------------------------------
    def lock_partition(self, partition: str, *, exclusive: bool) -> datetime:
        """Take the partition lock (shared or exclusive) and return the database clock."""
        if self.backend == "postgresql":
            params = {"ns": dialect.ADVISORY_NAMESPACE, "k": dialect.advisory_key(partition)}
            if self.fast is not None and not exclusive:
                return self.fast.all("lock_partition_shared", params)[0][1]  # type: ignore[no-any-return]
            return self.conn.execute(_PG_LOCK_EXCLUSIVE, params).one()[1]  # type: ignore[no-any-return]
        row_lock = _LOCK_PARTITION_ROW.with_for_update(read=not exclusive)
        now: datetime | None = self.conn.execute(row_lock, {"p": partition}).scalar()
        if now is None:
            raise MissingCounters(partition, [])
        return now

    def ensure_partition(self, partition: str, now: datetime) -> None:
        """Make sure the partition has its row (so the sweeper and audit find it).

        Elsewhere :meth:`lock_partition` already needed the row; PostgreSQL's advisory lock
        does not, so there the row is inserted if missing.
        """
        if self.backend == "postgresql":
            self.create_missing(partition, [], now)

    def db_now(self) -> datetime:
        """The database clock."""
        return self.conn.execute(_DB_NOW).scalar_one()  # type: ignore[no-any-return]

    # -- reservations ----------------------------------------------------------------------
    def find_reservation_by_key(self, partition: str, key: str) -> StoredReservation | None:
        params = {"p": partition, "key": key}
        if self.fast is not None:
            return _one(self.fast.all("find_reservation_by_key", params))
        return _one(self.conn.execute(_FIND_BY_KEY, params).all())

    def find_reservation(self, reservation_id: str) -> StoredReservation | None:
        return _one(self.conn.execute(_FIND_BY_ID, {"id": reservation_id}).all())

    def lock_reservation(self, reservation_id: str) -> tuple[StoredReservation, datetime] | None:
        """Lock one reservation row and read the clock."""
        if self.fast is not None:
            rows: Sequence[Any] = self.fast.all("lock_reservation", {"id": reservation_id})
        else:
            rows = self.conn.execute(_LOCK_BY_ID, {"id": reservation_id}).all()
        stored = _one(rows)
        return None if stored is None else (stored, rows[0].db_now)

    def lock_expired(self, partition: str, limit: int, now: datetime) -> list[StoredReservation]:
        """Lock up to ``limit`` pending reservations expired at ``now`` that nobody else holds."""
        params = {"p": partition, "n": limit, "now": now}
        if self.fast is not None:
            return _many(self.fast.all("lock_expired", params))
        if self.backend in ("mysql", "mariadb"):
            candidates = list(self.conn.execute(_EXPIRED_IDS, params).scalars())
            ids = candidates and list(self.conn.execute(_LOCK_IDS_IF_PENDING, {"ids": candidates}).scalars())
        else:
            ids = list(self.conn.execute(_LOCK_EXPIRED_IDS, params).scalars())
        if not ids:
            return []
        return _many(self.conn.execute(_READ_MANY, {"ids": ids}).all())

    def insert_reservation(
        self, reservation: Reservation, request_hash: str, kube: Mapping[str, Any] | None = None
    ) -> None:
        header = {
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
        }
        if self.fast is not None:
            self.fast.run("insert_reservation", header)
            if reservation.resources:
                items = {
                    "rid": reservation.id,
                    "resources": list(reservation.resources),
                    "amounts": list(reservation.resources.values()),
                }
                self.fast.run("insert_items", items)
            return
        self.conn.execute(_INSERT_HEADER, header)
        if reservation.resources:
            self.conn.execute(
                _INSERT_ITEMS,
                [
                    {"reservation_id": reservation.id, "resource": res, "amount": amount, "committed": None}
                    for res, amount in reservation.resources.items()
                ],
            )

    def resolve_reservation(self, reservation_id: str, state: ReservationState, now: datetime) -> bool:
        """``pending -> state`` as a conditional update; False if it was no longer pending."""
        params = {"rid": reservation_id, "new_state": state.value, "now": now}
        if self.fast is not None:
            return self.fast.run("resolve_reservation", params).rowcount == 1
        return self.conn.execute(_RESOLVE, params).rowcount == 1

    def record_commits(self, reservation_id: str, committed: Mapping[str, int], *, whole: bool) -> None:
        """Record what each item committed (``whole``: everything that was reserved)."""
        if whole:
            if self.fast is not None:
                self.fast.run("commit_all_items", {"rid": reservation_id})
            else:
                self.conn.execute(_COMMIT_ALL_ITEMS, {"rid": reservation_id})
            return
        self.conn.execute(
            _SET_COMMITTED,
            [{"rid": reservation_id, "res": res, "v_committed": amount} for res, amount in committed.items()],
        )

    def expire_reservations(self, ids: Sequence[str], now: datetime) -> int:
        params = {"ids": list(ids), "now": now}
        if self.fast is not None:
            return self.fast.run("expire_reservations", params).rowcount
        return self.conn.execute(_EXPIRE_MANY, params).rowcount

    # -- counters --------------------------------------------------------------------------
    def lock_queue_counters(
        self, partition: str, pairs: Iterable[tuple[str, str]], *, create_missing: bool
    ) -> dict[tuple[str, str], Counter]:
        """Lock the queue counters of ``pairs`` (queue, resource), in canonical order.

        With ``create_missing`` a missing counter raises :class:`MissingCounters` so that the
        runner creates it in a transaction of its own and starts this one again.
        """
        wanted = set(pairs)
        if not wanted:
            return {}
        scopes = sorted({q for q, _ in wanted})
        resources = sorted({r for _, r in wanted})
        params = {"p": partition, "scopes": scopes, "resources": resources}
        if self.fast is not None:
            rows: Sequence[Any] = self.fast.all("lock_queue_counters", params)
        else:
            rows = self.conn.execute(_LOCK_QUEUE, params).all()
        found = {(row.scope, row.resource): _counter(row) for row in rows}
        if create_missing and len(wanted - found.keys()) > 0:
            raise MissingCounters(partition, sorted(wanted - found.keys()))
        return {pair: counter for pair, counter in found.items() if pair in wanted}

    def lock_subtree_counters(
        self, partition: str, scopes: Iterable[str], resources: Iterable[str], *, lock: bool = True
    ) -> list[Counter]:
        """Lock the limits set on ``scopes`` for ``resources``, in canonical order."""
        scopes, resources = sorted(set(scopes)), sorted(set(resources))
        if not scopes or not resources:
            return []
        params = {"p": partition, "scopes": scopes, "resources": resources}
        if self.fast is not None and lock:
            rows: Sequence[Any] = self.fast.all("lock_subtree_counters", params)
        else:
            rows = self.conn.execute(_LOCK_SUBTREE if lock else _READ_SUBTREE, params).all()
        return [_counter(row) for row in rows]

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
        if self.fast is not None:
            self.fast.run(
                "apply_counter_deltas",
                {
                    "ids": [cid for cid, _ in changes],
                    "dis": [d[0] for _, d in changes],
                    "drs": [d[1] for _, d in changes],
                    "now": now,
                },
            )
            return
        self.conn.execute(
            _APPLY,
            [{"cid": cid, "d_in_use": di, "d_reserved": dr, "now": now} for cid, (di, dr) in changes],
        )

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

    # -- audit -----------------------------------------------------------------------------
    def journal_sums(self, partition: str) -> dict[tuple[str, str], int]:
        """SUM(delta) of the journal per (queue, resource): what in_use must be."""
        rows = self.conn.execute(_JOURNAL_SUMS, {"p": partition})
        return {(row.queue, row.resource): int(row.total) for row in rows}

    def pending_sums(self, partition: str) -> dict[tuple[str, str], int]:
        """SUM(amount) of pending reservations per (queue, resource): what reserved must be."""
        rows = self.conn.execute(_PENDING_SUMS, {"p": partition})
        return {(row.queue, row.resource): int(row.total) for row in rows}

    # -- journal ---------------------------------------------------------------------------
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
        changes = {resource: delta for resource, delta in deltas.items() if delta != 0}
        if not changes:
            return
        if self.fast is not None:
            params = {
                "p": partition,
                "q": queue,
                "kind": kind,
                "rid": reservation_id,
                "op": operation_id,
                "now": now,
                "resources": list(changes),
                "deltas": list(changes.values()),
            }
            self.fast.run("append_journal", params)
            return
        rows = [
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
            for resource, delta in changes.items()
        ]
        self.conn.execute(_INSERT_JOURNAL, rows)

    def operation_recorded(self, operation_id: str) -> bool:
        return self.conn.execute(_OPERATION_RECORDED, {"op": operation_id}).first() is not None


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


def _many(rows: Sequence[Any]) -> list[StoredReservation]:
    grouped: dict[str, list[Any]] = {}
    for row in rows:
        grouped.setdefault(row.id, []).append(row)
    return [_build(group) for group in grouped.values()]


def _one(rows: Sequence[Any]) -> StoredReservation | None:
    return _build(list(rows)) if rows else None


def _build(rows: list[Any]) -> StoredReservation:
    head = rows[0]
    items = [row for row in rows if row.resource is not None]
    state = ReservationState(head.state)
    committed = (
        {row.resource: row.committed or 0 for row in items} if state is ReservationState.COMMITTED else None
    )
    reservation = Reservation(
        id=head.id,
        state=state,
        partition=head.partition,
        queue=head.queue,
        resources={row.resource: row.amount for row in sorted(items, key=lambda r: r.resource)},
        created_at=_aware(head.created_at),
        expires_at=_aware(head.expires_at),
        key=head.key,
        user=head.user_name,
        groups=tuple(json.loads(head.groups)) if head.groups else (),
        application=head.application,
        priority_class=head.priority_class,
        committed=committed,
        resolved_at=_aware(head.resolved_at) if head.resolved_at is not None else None,
        released_at=_aware(head.released_at) if head.released_at is not None else None,
    )
    kube = json.loads(head.kube) if head.kube else None
    return StoredReservation(reservation=reservation, request_hash=head.request_hash, kube=kube)


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)


def _naive(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
