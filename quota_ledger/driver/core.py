"""DbQuotaDriver: owns the database engine and runs each ledger transaction with bounded retries."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, exc, select
from sqlalchemy.engine import URL

from quota_ledger.driver import dialect, pg_functions
from quota_ledger.driver.schema import quota_partitions
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.model.errors import DatabaseUnavailable, QuotaLedgerError, SchemaNotReady

T = TypeVar("T")
log = logging.getLogger("quota_ledger.driver")


class DbQuotaDriver:
    """Holds all SQL of the ledger. :class:`~quota_ledger.QuotaEngine` holds the policy.

    ``run(work)`` executes ``work(tx)`` in one transaction. Deadlocks, serialization failures,
    lock timeouts, SQLite busy errors and lost connections roll the whole transaction back and
    run it again, at most ``max_attempts`` times with jittered exponential backoff; every
    operation of the engine is written so that running it again is safe.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_attempts: int = 10,
        backoff_base: float = 0.005,
        backoff_cap: float = 0.5,
    ) -> None:
        self.engine = engine
        self.backend = engine.dialect.name
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._lock = threading.Lock()
        #: retries taken, by cause (``conflict``, ``disconnect``, ``duplicate``)
        self.retries: Tally[str] = Tally()
        #: PostgreSQL runs plain reserve, commit and expiry as server-side functions (0004)
        self.functions = self.backend == "postgresql"

    @classmethod
    def from_url(cls, url: str | URL, *, pool_size: int = 10, echo: bool = False) -> DbQuotaDriver:
        return cls(dialect.build_engine(url, pool_size=pool_size, echo=echo))

    @property
    def url(self) -> URL:
        return self.engine.url

    def dispose(self) -> None:
        self.engine.dispose()

    def run(self, work: Callable[[LedgerTx], T], *, isolation: str | None = None) -> T:
        """Run ``work`` in one transaction, retrying the whole of it on transient failures."""
        attempt = 0
        while True:
            try:
                with self.engine.connect() as conn:
                    if isolation is not None and self.backend != "sqlite":
                        conn.execution_options(isolation_level=isolation)
                    tx = LedgerTx(conn, self.backend, attempt)
                    with conn.begin():
                        result = work(tx)
                for hook in tx.after_commit:
                    hook()
                return result
            except exc.DBAPIError as error:
                attempt = self._after_error(error, attempt)
            except (exc.TimeoutError, exc.DisconnectionError) as error:
                attempt = self._after_pool_error(error, attempt)

    def call(self, sql: str, params: Mapping[str, Any]) -> list[Any] | None:
        """Run one PostgreSQL ledger function (see :mod:`.pg_functions`) as its own transaction,
        retried as :meth:`run` retries; None when it declined or the schema has no functions."""
        if not self.functions:
            return None
        attempt = 0
        while True:
            try:
                return pg_functions.call(self.engine, sql, params)
            except pg_functions.Unavailable:
                self.functions = False
                log.warning("no ledger functions in this database (schema before 0004): general path only")
                return None
            except exc.DBAPIError as error:
                attempt = self._after_error(error, attempt)
            except (exc.TimeoutError, exc.DisconnectionError) as error:
                attempt = self._after_pool_error(error, attempt)

    @contextmanager
    def translated(self) -> Iterator[None]:
        """Work on :attr:`engine` outside :meth:`run` (migrations, the schema revision) raises
        the ledger's errors too: :class:`DatabaseUnavailable` when the database cannot be
        reached. Not retried: a migration is not safe to run again halfway on every backend."""
        try:
            yield
        except exc.DBAPIError as error:
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

    def _after_error(self, error: exc.DBAPIError, attempt: int) -> int:
        """Raise what the caller should see, or count a retry, wait, and return the attempt."""
        kind = dialect.classify(error)
        if kind == dialect.MISSING_SCHEMA:
            raise SchemaNotReady() from error
        if kind == dialect.FATAL:
            raise QuotaLedgerError(f"database error: {type(error.orig).__name__}") from error
        attempt += 1
        self._count(kind)
        if attempt >= self.max_attempts:
            raise DatabaseUnavailable(
                f"gave up after {attempt} attempts ({kind}): {type(error.orig).__name__}"
            ) from error
        self._sleep(attempt)
        return attempt

    def _after_pool_error(self, error: Exception, attempt: int) -> int:
        # Pool exhausted or a connection that failed its check: nothing was sent.
        attempt += 1
        self._count("disconnect")
        if attempt >= self.max_attempts:
            raise DatabaseUnavailable(str(error)) from error
        self._sleep(attempt)
        return attempt

    def partitions(self) -> list[str]:
        """Every partition that has ever held a counter."""

        def work(tx: LedgerTx) -> list[str]:
            return list(
                tx.conn.execute(select(quota_partitions.c.name).order_by(quota_partitions.c.name)).scalars()
            )

        return self.run(work)

    def _sleep(self, attempt: int) -> None:
        cap = min(self.backoff_cap, self.backoff_base * 2**attempt)
        time.sleep(random.uniform(0, cap))  # noqa: S311 - jitter, not cryptography

    def _count(self, kind: str) -> None:
        with self._lock:
            self.retries[kind] += 1
        log.debug("retrying transaction: %s", kind)
