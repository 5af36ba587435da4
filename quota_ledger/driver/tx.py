"""LedgerTx: one database transaction of the ledger, composed of the statements of each table
family (:mod:`.reservations`, :mod:`.counters`, :mod:`.journal`, :mod:`.configs`,
:mod:`.identity`, :mod:`.apps`). Every statement is named, with a comment on what it locks.

Canonical lock order, the same on every path, so there are no deadlocks by design:

1. the config head row (configuration writers only),
2. the partition lock (reserve takes it shared; limit changes and ``audit --fix`` exclusively),
3. reservation rows (commit, rollback and the sweeper, which skips rows already locked),
4. application rows, sorted by ``app_key``,
5. ``queue`` counters, sorted by (scope, resource),
6. ``subtree`` counters, sorted by (scope, resource), read by a *separate* statement so that
   a subtree row created while we waited for step 5 is seen (READ COMMITTED re-reads),
7. user/group counters (``quota_identity_usages``), sorted by (kind, name, queue, resource).

New rows (a reservation's header, items, journal entries) may be written at any point: nobody
else can wait for a row not yet committed. Reserve writes its own *before* locking the counters,
so the shared counters are held only for check, update and commit; resolving reservations
(commit, rollback, expiry) writes once the rule has decided, its journal entries with the
counter updates (on MariaDB one compound statement).

Only reserve can create ``queue`` counters, and only under the shared partition lock, so a
limit change holding the exclusive lock sees every counter it has to sum (no phantoms). It
creates them in its own transaction at step 5: it locks those that exist, inserts the missing
ones skipping duplicates (a concurrent inserter of the same row is waited for) and locks them
with a second statement, which under READ COMMITTED sees a row another transaction committed
meanwhile. On PostgreSQL the locks of the first statement are let go first (rolled back to a
savepoint), so that the inserts come before every counter lock and two first uses cannot
deadlock; on MariaDB they stay held, and a deadlock with another first use is retried. A
refusal rolls the inserts back with the rest. The PostgreSQL reserve function
(``sql/reserve_many.sql``) makes the same rows in its one call: after the application rows
(its own, then those of a user or group whose counters it creates, which value them), it
inserts every missing queue and user/group counter before it locks any counter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, exc, func, select
from sqlalchemy.engine import NestedTransaction

from quota_ledger.driver import dialect, inline, pg_functions
from quota_ledger.driver.apps import AppStatements
from quota_ledger.driver.configs import ConfigStatements
from quota_ledger.driver.counters import HELD, CounterStatements
from quota_ledger.driver.identity import IdentityStatements
from quota_ledger.driver.idle import IdleStatements
from quota_ledger.driver.journal import JournalStatements
from quota_ledger.driver.pg_cursor import Call, PgCursor, with_text_arrays
from quota_ledger.driver.reservations import ReservationStatements, one_stored
from quota_ledger.driver.schema import quota_partitions
from quota_ledger.driver.waiting_line import WaitingStatements
from quota_ledger.model import charges
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.model.values import Reservation, ReservationState

# -- partition (step 2) ------------------------------------------------------------------------
# lock_partition_*: MariaDB/SQLite form; locks the partition row (shared or exclusive).
_LOCK_PARTITION_ROW = select(dialect.utcnow()).where(quota_partitions.c.name == bindparam("p"))
# lock_partition_* on PostgreSQL: a transaction-scoped advisory lock; no row is written.
_PG_LOCK_EXCLUSIVE = select(func.pg_advisory_xact_lock(bindparam("ns"), bindparam("k")), dialect.utcnow())
PG_LOCK_SHARED = "SELECT pg_advisory_xact_lock_shared(%(ns)s, %(k)s), TIMEZONE('UTC', clock_timestamp())"
# db_now: the database clock; no lock.
_DB_NOW = select(dialect.utcnow())


class LedgerTx(
    ReservationStatements,
    AppStatements,
    CounterStatements,
    IdentityStatements,
    JournalStatements,
    ConfigStatements,
    IdleStatements,
    WaitingStatements,
):
    """One database transaction of the ledger. The engine decides; this class reads and writes."""

    def __init__(
        self, conn: Connection, backend: str, attempt: int, installed: dict[str, bool] | None = None
    ) -> None:
        self.conn = conn
        self.backend = backend
        #: 0 on the first try; a retry after a lost connection checks what already happened
        self.attempt = attempt
        #: run by the driver once this transaction has committed (never for a failed attempt)
        self.after_commit: list[Callable[[], None]] = []
        #: PostgreSQL runs the hot statements on the psycopg cursor (see pg_cursor)
        self.pg = PgCursor(conn) if backend == "postgresql" else None
        #: inside writes_together: the writes to run as one when the block ends
        self.deferred: list[inline.Statement] | None = None
        #: what this transaction added to each counter so far: (in use, reserved)
        self.charged: dict[charges.CounterKey, tuple[int, int]] = {}
        self.own_counters = set()
        #: which of the ledger's PostgreSQL functions the database has, as far as known (shared
        #: by the driver's transactions: :meth:`has_function`)
        self.installed = installed if installed is not None else {}
        conn.info[HELD] = set()

    def lock_partition(self, partition: str, *, exclusive: bool) -> datetime:
        """Take the partition lock (shared or exclusive) and return the database clock."""
        if self.backend == "postgresql":
            params = {"ns": dialect.ADVISORY_NAMESPACE, "k": dialect.advisory_key(partition)}
            if self.pg is not None and not exclusive:
                return self.pg.all(PG_LOCK_SHARED, params)[0][1]  # type: ignore[no-any-return]
            return self.conn.execute(_PG_LOCK_EXCLUSIVE, params).one()[1]  # type: ignore[no-any-return]
        row_lock = _LOCK_PARTITION_ROW.with_for_update(read=not exclusive)
        now: datetime | None = self.conn.execute(row_lock, {"p": partition}).scalar()
        if now is None:
            # A new partition: its row is made by the first transaction that locks it (a
            # concurrent one waits for our insert, then locks the row we committed).
            self.create_missing(partition, [], self.db_now())
            now = self.conn.execute(row_lock, {"p": partition}).scalar_one()
        return now

    def ensure_partition(self, partition: str, now: datetime) -> None:
        """Make sure the partition has its row (so the sweeper and audit find it).

        Elsewhere :meth:`lock_partition` already needed the row; PostgreSQL's advisory lock
        does not, so there the row is inserted if missing.
        """
        if self.backend == "postgresql":
            self.create_missing(partition, [], now)

    def savepoint(self) -> NestedTransaction | None:
        """On PostgreSQL, a savepoint: rolling back to it lets go of the row locks taken since
        (a subtransaction's locks end with it). Elsewhere None: InnoDB keeps them anyway."""
        return self.conn.begin_nested() if self.backend == "postgresql" else None

    @contextmanager
    def writes_together(self) -> Iterator[None]:
        """The inserts and counter updates inside the block (``insert_reservations``,
        ``append_journal_rows``, ``insert_summaries``, ``update_apps``, ``apply_counter_deltas``,
        ``apply_identity_deltas``) run when it ends, in order, as one compound statement on
        MariaDB (one round trip). Nothing inside may read what they write; a block left by an
        error runs none of them."""
        if self.deferred is not None or self.pg is not None:
            yield
            return
        self.deferred = []
        try:
            yield
            statements = self.deferred
        finally:
            self.deferred = None
        inline.run(self.conn, statements)

    def apply_charges(self, deltas: Mapping[charges.CounterKey, tuple[int, int]], now: datetime) -> None:
        """Add what the rule decided (:mod:`quota_ledger.model.charges`) to the locked counters
        of both tables."""
        usages, identity = charges.split(deltas)
        self.apply_counter_deltas(usages, now)
        self.apply_identity_deltas(identity, now)
        for counter, (in_use, reserved) in deltas.items():
            self._charged(counter, in_use, reserved)

    def _charged(self, counter: charges.CounterKey, in_use: int, reserved: int) -> None:
        """Count what this transaction added to ``counter`` (see :meth:`freed`)."""
        was = self.charged.get(counter, (0, 0))
        self.charged[counter] = (was[0] + in_use, was[1] + reserved)

    def release_by_function(
        self, reservation_id: str, operation_id: str | None, *, committed: bool
    ) -> Reservation | None:
        """PostgreSQL: give back what a plain reservation holds by ``quota_ledger_release``, in
        this transaction (what it declines: :mod:`.pg_functions`): a pending one is rolled back,
        and with ``committed`` a committed one is released. The reservation as it left it, or
        None when it declined (it wrote nothing) or this database has no such function (a
        schema before 0019); None elsewhere."""
        if self.pg is None or not self.has_function(pg_functions.RELEASE_FUNCTION):
            return None
        params = {"id": reservation_id, "op": operation_id, "committed": committed}
        # (pipelined: the transaction's BEGIN goes with it, in one round trip)
        (rows,) = self.pg.pipelined([Call(pg_functions.RELEASE, params)])
        stored = one_stored(rows)
        if stored is None:
            return None
        # (the counters it names are its lineage's: a queue's own counter limits nothing)
        in_use = stored.reservation.state is ReservationState.COMMITTED
        for counter_id, given_back in zip(
            rows[0].counter_ids or (), rows[0].counter_deltas or (), strict=True
        ):
            if in_use:
                self._charged(("usages", counter_id), -given_back, 0)
            else:
                self._charged(("usages", counter_id), 0, -given_back)
        return stored.reservation

    def grant_by_function(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        """PostgreSQL: run a ``quota_ledger_grant`` call in this transaction; its rows (none: it
        declined, and wrote nothing). What a grant charged its lineage counts in :meth:`freed`."""
        assert self.pg is not None
        rows = self.pg.all(sql, with_text_arrays(params))
        if rows and rows[0].counter_ids is not None:
            for counter_id, amount in zip(rows[0].counter_ids, rows[0].counter_amounts, strict=True):
                self._charged(("usages", counter_id), 0, amount)
        return rows

    def has_function(self, name: str) -> bool:
        """Whether the database has the ledger's function ``name`` (PostgreSQL; asked once)."""
        found = self.installed.get(name)
        if found is None:
            assert self.pg is not None
            found = self.installed[name] = bool(self.pg.all(pg_functions.INSTALLED, {"name": name})[0][0])
        return found

    def freed(self) -> bool:
        """Whether this transaction left a counter that may limit a request (not a queue's own
        counter, which has no limit) with less in use plus reserved than it found: capacity a
        waiting request may now fit in."""
        return any(
            in_use + reserved < 0
            for counter, (in_use, reserved) in self.charged.items()
            if counter not in self.own_counters
        )

    def db_now(self) -> datetime:
        """The database clock."""
        return self.conn.execute(_DB_NOW).scalar_one()  # type: ignore[no-any-return]


class Undo:
    """A set's savepoint, taken before its first write: :meth:`on_failure` goes back to it when
    the set fails with an error that leaves the transaction usable (a ledger error, a database
    error the database meant); :meth:`rollback` goes back to it so that the set can be decided
    again, and forgets what the set meant to do after commit; :meth:`release` keeps what the
    set wrote."""

    def __init__(self, tx: LedgerTx) -> None:
        self.tx = tx
        self.savepoint: NestedTransaction | None = None
        #: how many after-commit hooks the transaction had when the savepoint was taken
        self.hooks = 0

    def before_write(self) -> None:
        if self.savepoint is None:
            self.savepoint = self.tx.conn.begin_nested()
            self.hooks = len(self.tx.after_commit)

    def rollback(self) -> None:
        if self.savepoint is not None:
            self.savepoint.rollback()
            self.savepoint = None
            del self.tx.after_commit[self.hooks :]

    def release(self) -> None:
        if self.savepoint is not None:
            self.savepoint.commit()
            self.savepoint = None

    @contextmanager
    def on_failure(self) -> Iterator[None]:
        try:
            yield
        except Exception as error:
            if set_failed(error):
                self.rollback()  # (a conflict or a lost connection fails the whole attempt)
            raise


def set_failed(error: Exception) -> bool:
    """Whether ``error`` fails a set but leaves its transaction usable, so that the set is
    undone and its requests' steps decide them: a ledger error, or a database error the
    database meant (not a conflict or a lost connection: those fail the attempt, which the
    driver runs again)."""
    if isinstance(error, QuotaLedgerError):
        return True
    return isinstance(error, exc.DBAPIError) and dialect.classify(error) == dialect.FATAL
