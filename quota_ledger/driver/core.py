"""DbQuotaDriver: owns the database engine and runs each ledger transaction with bounded retries."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

from sqlalchemy import Engine, event, exc, select
from sqlalchemy.engine import URL

from quota_ledger.driver import counters, dialect, pg_functions, time_limit, topology
from quota_ledger.driver.fair_lock import FairLock
from quota_ledger.driver.schema import quota_partitions
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.model.errors import (
    DatabaseUnavailable,
    DatabaseUnreachable,
    InvalidRequest,
    QuotaLedgerError,
    SchemaNotReady,
)

T = TypeVar("T")
log = logging.getLogger("quota_ledger.driver")


class DbQuotaDriver:
    """Holds all SQL of the ledger. :class:`~quota_ledger.QuotaEngine` holds the policy.

    ``run(work)`` executes ``work(tx)`` in one transaction. Deadlocks, serialization failures,
    lock timeouts, SQLite busy errors and lost connections roll the whole transaction back and
    run it again; every operation of the engine is written so that running it again is safe.
    One operation makes at most ``retry_attempts`` attempts and starts none after
    ``retry_seconds`` (both bound it; :class:`DatabaseUnavailable` when either is spent).

    Waits between attempts are jittered and double each time up to ``backoff_cap``. A conflict
    is retried within milliseconds (from ``backoff_base``, fully jittered). A disconnect waits
    from :attr:`DISCONNECT_BACKOFF` on, at least half of each step: with the defaults (10
    attempts, 15 s, cap 3 s) the nine waits of a disconnect add up to 9 to 15 s, so a failover
    of up to about 9 s (a Galera node killed, a standby promoted) is always ridden out, and one
    of up to 15 s usually is, before a caller sees :class:`DatabaseUnavailable`.

    A connection that cannot be opened is :class:`DatabaseUnreachable`, naming the host and the
    driver's reason. Failed authentication and an unknown database are raised at once: no retry
    fixes them. A refused connection is retried like a disconnect (a restarting server refuses
    for a few seconds) unless ``retry_refused`` is false: then the first attempt of an
    operation that meets one gives up at once (the CLI's choice: nothing listening there is
    far likelier a wrong URL or a stopped server than a failover, and 14 s of silence helps
    no one). A refusal after the operation has already lost a connection is still retried.

    ``read_engine``, when given, runs ``run(work, read_only=True)``: replicas for reads that
    tolerate bounded staleness. Everything else runs on ``engine``, the writer.
    """

    #: the shortest first wait after a disconnect, in seconds: a restart or a failover takes time
    DISCONNECT_BACKOFF = 0.1

    def __init__(
        self,
        engine: Engine,
        *,
        read_engine: Engine | None = None,
        retry_attempts: int = 10,
        retry_seconds: float = 15.0,
        backoff_base: float = 0.005,
        backoff_cap: float = 3.0,
        retry_refused: bool = True,
    ) -> None:
        self.engine = engine
        self.read_engine = read_engine
        if not event.contains(engine, "rollback_savepoint", counters.forget_held):
            event.listen(engine, "rollback_savepoint", counters.forget_held)
        self.backend = engine.dialect.name
        #: attempts one operation makes at most (``retry_attempts``)
        self.max_attempts = retry_attempts
        #: seconds after the first attempt of an operation when no further attempt starts
        self.retry_seconds = retry_seconds
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        #: a refused connection on an operation's first attempt is retried (else: given up at once)
        self.retry_refused = retry_refused
        self._lock = threading.Lock()
        #: retries taken, by cause (``conflict``, ``disconnect``, ``duplicate``)
        self.retries: Tally[str] = Tally()
        #: PostgreSQL runs plain reserve, commit and expiry as server-side functions (0004)
        self.functions = self.backend == "postgresql"
        #: which of the ledger's later functions the database has, as far as known (by name)
        self.installed: dict[str, bool] = {}
        #: SQLite writes one transaction at a time: this process's transactions queue on a lock,
        #: first come first served, instead of polling the database's busy handler, whose
        #: sleeps (up to 100 ms a try) made p99 latencies of seconds with 16 threads. Other
        #: processes on the same file still meet the handler.
        self._one_at_a_time = FairLock() if self.backend == "sqlite" else nullcontext()

    @classmethod
    def from_url(
        cls,
        url: str | URL | Sequence[str | URL],
        *,
        read_urls: Sequence[str | URL] | None = None,
        pool_size: int = 10,
        echo: bool = False,
        retry_attempts: int = 10,
        retry_seconds: float = 15.0,
        backoff_cap: float = 3.0,
        galera_sync_wait: int = topology.GALERA_SYNC_WAIT,
        retry_refused: bool = True,
    ) -> DbQuotaDriver:
        """A driver on ``url``: one URL, or the writer candidates in order of preference (see
        :mod:`.topology`); ``read_urls`` are replicas for :meth:`run`'s read-only work."""
        writer = topology.writer_engine(
            topology.url_list(url), pool_size=pool_size, echo=echo, galera_sync_wait=galera_sync_wait
        )
        reader = None
        if read_urls:
            readers = topology.url_list(read_urls, field="read_db")
            if readers[0].get_backend_name() != writer.dialect.name:
                writer.dispose()
                raise InvalidRequest("the read URLs name another database than the writer's", field="read_db")
            reader = topology.read_engine(readers, pool_size=pool_size, echo=echo)
        return cls(
            writer,
            read_engine=reader,
            retry_attempts=retry_attempts,
            retry_seconds=retry_seconds,
            backoff_cap=backoff_cap,
            retry_refused=retry_refused,
        )

    @property
    def url(self) -> URL:
        return self.engine.url

    def dispose(self) -> None:
        self.engine.dispose()
        if self.read_engine is not None:
            self.read_engine.dispose()

    def run(
        self,
        work: Callable[[LedgerTx], T],
        *,
        isolation: str | None = None,
        read_only: bool = False,
        timeout: float | None = None,
        rollback: bool = False,
    ) -> T:
        """Run ``work`` in one transaction, retrying the whole of it on transient failures.

        ``read_only`` work that may see a slightly stale state goes to the read engine, when
        there is one; it must not write. ``timeout`` (seconds) bounds the whole call: each
        attempt's lock waits and statements get what is left of it (:mod:`.time_limit`), and
        :class:`DatabaseUnavailable` is raised once it is spent. With ``rollback`` the
        transaction is rolled back when ``work`` returns: what it decided, nothing it wrote.
        """
        engine = self.read_engine if read_only and self.read_engine is not None else self.engine
        budget = self.retry_seconds if timeout is None else min(self.retry_seconds, timeout)
        deadline = time.monotonic() + budget
        attempt = 0
        while True:
            try:
                with self._one_at_a_time, engine.connect() as conn:
                    if isolation is not None and self.backend != "sqlite":
                        conn.execution_options(isolation_level=isolation)
                    tx = LedgerTx(conn, self.backend, attempt, self.installed)
                    try:
                        with conn.begin() as transaction:
                            if timeout is not None:
                                time_limit.bound(conn, self.backend, deadline - time.monotonic())
                            result = work(tx)
                            if rollback:
                                transaction.rollback()
                    finally:
                        if timeout is not None:
                            time_limit.unbound(conn, self.backend)
                if not rollback:
                    for hook in tx.after_commit:
                        hook()
                return result
            except exc.DBAPIError as error:
                attempt = self._after_error(error, attempt, deadline, budget, timeout is not None)
            except (exc.TimeoutError, exc.DisconnectionError) as error:
                attempt = self._after_pool_error(error, attempt, deadline)

    def call(self, sql: str, params: Mapping[str, Any]) -> list[Any] | None:
        """Run one PostgreSQL ledger function (see :mod:`.pg_functions`) as its own transaction,
        retried as :meth:`run` retries; None when it declined or the schema has no functions."""
        if not self.functions:
            return None
        deadline = time.monotonic() + self.retry_seconds
        attempt = 0
        while True:
            try:
                return pg_functions.call(self.engine, sql, params)
            except pg_functions.Unavailable:
                self.functions = False
                log.warning("no ledger functions in this database (schema before 0004): general path only")
                return None
            except exc.DBAPIError as error:
                attempt = self._after_error(error, attempt, deadline)
            except (exc.TimeoutError, exc.DisconnectionError) as error:
                attempt = self._after_pool_error(error, attempt, deadline)

    def has_function(self, name: str) -> bool:
        """Whether the database has the ledger's PostgreSQL function ``name`` (asked once)."""
        if not self.functions:
            return False
        found = self.installed.get(name)
        return found if found is not None else self.run(lambda tx: tx.has_function(name))

    @contextmanager
    def translated(self) -> Iterator[None]:
        """Work on :attr:`engine` outside :meth:`run` (migrations, the schema revision) raises
        the ledger's errors too: :class:`DatabaseUnavailable` when the database cannot be
        reached. Not retried: a migration is not safe to run again halfway on every backend."""
        try:
            yield
        except exc.DBAPIError as error:
            failed = dialect.connect_failure(error)
            if failed is not None:
                raise self._unreachable(failed, 1) from error
            kind = dialect.classify(error)
            if kind == dialect.MISSING_SCHEMA:
                raise SchemaNotReady() from error
            if kind == dialect.FATAL:
                # An operator runs these: the server's own words say what to fix.
                first = str(error.orig).strip().splitlines()[:1]
                detail = f"{type(error.orig).__name__}: {first[0]}" if first else type(error.orig).__name__
                raise QuotaLedgerError(f"database error: {detail}") from error
            raise DatabaseUnavailable(f"{kind}: {type(error.orig).__name__}") from error
        except (exc.TimeoutError, exc.DisconnectionError) as error:
            raise DatabaseUnavailable(str(error)) from error

    def _after_error(
        self,
        error: exc.DBAPIError,
        attempt: int,
        deadline: float,
        budget: float | None = None,
        bounded: bool = False,
    ) -> int:
        """Raise what the caller should see, or count a retry, wait, and return the attempt.

        ``bounded``: the caller set a time limit, and a statement it interrupted is retried
        while time is left, like a lock timeout."""
        failed = dialect.connect_failure(error)
        if failed is not None:
            connect_kind = failed[0]
            if connect_kind in dialect.PERMANENT or (
                connect_kind == dialect.REFUSED and attempt == 0 and not self.retry_refused
            ):
                raise self._unreachable(failed, attempt + 1) from error
        kind = dialect.classify(error)
        if bounded and kind == dialect.FATAL and time_limit.interrupted(error):
            kind = dialect.RETRY_CONFLICT
        if kind == dialect.MISSING_SCHEMA:
            raise SchemaNotReady() from error
        if kind == dialect.FATAL:
            raise QuotaLedgerError(f"database error: {type(error.orig).__name__}") from error
        attempt += 1
        self._count(kind)
        spent = self._spent(attempt, deadline, budget)
        if spent:
            if failed is not None:
                seconds = None if attempt >= self.max_attempts else self.retry_seconds
                raise self._unreachable(failed, attempt, seconds) from error
            detail = f"{kind}: {type(error.orig).__name__}"
            raise DatabaseUnavailable(f"gave up after {spent} ({detail})") from error
        self._sleep(attempt, kind, deadline)
        return attempt

    def _unreachable(
        self, failed: tuple[str, str], attempts: int, seconds: float | None = None
    ) -> DatabaseUnreachable:
        kind, reason = failed
        return DatabaseUnreachable(
            dialect.where(self.engine.url),
            reason,
            permanent=kind in dialect.PERMANENT,
            attempts=attempts,
            seconds=seconds,
        )

    def _after_pool_error(self, error: Exception, attempt: int, deadline: float) -> int:
        # Pool exhausted or a connection that failed its check: nothing was sent.
        attempt += 1
        self._count("disconnect")
        spent = self._spent(attempt, deadline)
        if spent:
            raise DatabaseUnavailable(f"gave up after {spent}: {error}") from error
        self._sleep(attempt, dialect.RETRY_DISCONNECT, deadline)
        return attempt

    def _spent(self, attempt: int, deadline: float, budget: float | None = None) -> str | None:
        """What of the retry budget is spent after ``attempt`` attempts, if any."""
        if attempt >= self.max_attempts:
            return f"{attempt} attempts"
        if time.monotonic() >= deadline:
            return f"{attempt} attempts in {self.retry_seconds if budget is None else budget:g} s"
        return None

    def partitions(self) -> list[str]:
        """Every partition that has ever held a counter."""

        def work(tx: LedgerTx) -> list[str]:
            return list(
                tx.conn.execute(select(quota_partitions.c.name).order_by(quota_partitions.c.name)).scalars()
            )

        return self.run(work)

    def _sleep(self, attempt: int, kind: str, deadline: float) -> None:
        # Conflicts: full jitter spreads the contenders. Disconnects: half of each step is
        # certain, so a few quick failures (connection refused) do not spend every attempt
        # before a failover is over. Never past the deadline: the last attempt starts on it.
        if kind == dialect.RETRY_DISCONNECT:
            cap = min(self.backoff_cap, self.DISCONNECT_BACKOFF * 2**attempt)
            wait = random.uniform(cap / 2, cap)  # noqa: S311 - jitter, not cryptography
        else:
            cap = min(self.backoff_cap, self.backoff_base * 2**attempt)
            wait = random.uniform(0, cap)  # noqa: S311 - jitter, not cryptography
        time.sleep(max(0.0, min(wait, deadline - time.monotonic())))

    def _count(self, kind: str) -> None:
        with self._lock:
            self.retries[kind] += 1
        log.debug("retrying transaction: %s", kind)
