"""Group commit: many concurrent requests decided by one database transaction.

Each call that reaches a hot queue costs one transaction, one durable write (a WAL flush, a
redo log flush) and one hold of the queue's counter locks; threads on one queue queue up behind
each other's commits. With group commit the calling threads put their requests (a *step*: a
function of one :class:`LedgerTx`) on a queue and wait; one flusher thread per engine takes
whatever has queued, up to ``max_batch`` requests, and runs them in one transaction, each
inside its own savepoint. A request whose step raises a ledger error (:class:`OverQuota`,
:class:`ReservationNotFound`, ...) is rolled back to its savepoint and leaves the others alone,
so a batch decides exactly what its requests, run one after another, would have decided.

Every caller learns its outcome only after the batch's transaction has committed. The driver
retries the whole batch on a deadlock, a serialization failure or a lost connection (every step
is written to be run again; ``tx.attempt`` tells it a first attempt may have committed). Any
other database error (a request the database itself rejects) would fail the whole batch: its
requests are then decided again one transaction each, so each gets its own outcome.

There is no timer and no window: the flusher starts a transaction as soon as one request is
waiting, and the requests that arrive while it runs make up the next batch. A quiet ledger
pays only the hand-over to the flusher thread; a busy one gets larger batches. A dedicated
thread (rather than electing a caller as leader) keeps every caller's wait to its own batch and
gives :meth:`GroupCommit.close` one thread to stop.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from quota_ledger.driver import pg_functions
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.pg_fast import Call
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.model.errors import DatabaseUnavailable, QuotaLedgerError

T = TypeVar("T")
log = logging.getLogger("quota_ledger.group_commit")

#: how many requests one transaction decides at most, unless the engine says otherwise
DEFAULT_MAX_BATCH = 256


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What an engine's group commit has done so far (for metrics)."""

    #: transactions that decided a batch (a batch retried by the driver counts once)
    batches: int = 0
    #: requests decided in those transactions
    requests: int = 0
    #: the most requests one batch decided
    largest: int = 0
    #: batches a database error failed, whose requests were then decided one transaction each
    fallbacks: int = 0


@dataclass(frozen=True, slots=True)
class Quick(Generic[T]):
    """A request decided by one call of a PostgreSQL function that is all or nothing by itself
    and declines without aborting the transaction (``quota_ledger_try_*``): the call, and what
    its rows mean (None: declined, the request's step decides)."""

    call: Call
    finish: Callable[[list[Any]], T | None]


@dataclass(eq=False)
class _Job:
    step: Callable[[LedgerTx], Any]
    #: jobs of a batch run in this order (stable): requests on one queue together
    order: tuple[str, ...]
    #: the request's function call, if it has one now (PostgreSQL)
    fast: Callable[[LedgerTx], Quick[Any] | None] | None = None
    future: Future[Any] = field(default_factory=Future)


class _Refused:
    """A step's ledger error, delivered to its caller once the batch has committed."""

    __slots__ = ("error",)

    def __init__(self, error: QuotaLedgerError) -> None:
        self.error = error


class GroupCommit:
    """The request queue and flusher thread of one engine."""

    def __init__(self, driver: DbQuotaDriver, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self.driver = driver
        self.max_batch = max_batch
        self._queue: deque[_Job] = deque()
        self._ready = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._stats = BatchStats()
        self._functions: bool | None = None

    @property
    def stats(self) -> BatchStats:
        """Batches and requests decided so far."""
        return self._stats

    @property
    def pending(self) -> int:
        """Requests waiting for a batch (not counting the one being decided)."""
        with self._ready:
            return len(self._queue)

    @property
    def functions(self) -> bool:
        """Whether a batch may call the PostgreSQL functions that decline without aborting it
        (``quota_ledger_try_*``, revision 0011); asked of the database once."""
        if self._functions is None:
            installed = self.driver.functions and self.driver.run(
                lambda tx: pg_functions.try_installed(tx.conn)
            )
            self._functions = installed
        return self._functions

    def schema_changed(self) -> None:
        """Ask the database again which functions it has (after a migration)."""
        self._functions = None

    def run(
        self,
        step: Callable[[LedgerTx], T],
        order: Sequence[str] = (),
        fast: Callable[[LedgerTx], Quick[T] | None] | None = None,
    ) -> T:
        """Decide ``step`` in the next batch; its value once that batch has committed, or its
        error. ``order``: where it goes in its batch (requests on one queue side by side).
        ``fast``, when given, says which function call may decide the request (None: none);
        a batch sends all of its calls in one round trip before it runs any step."""
        job = _Job(step, tuple(order), fast)
        with self._ready:
            if self._closing:
                raise DatabaseUnavailable("the engine is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._flush_loop, name="quota-ledger-group-commit", daemon=True
                )
                self._thread.start()
            self._queue.append(job)
            self._ready.notify()
        result: T = job.future.result()
        return result

    def close(self) -> None:
        """Stop taking requests, decide those already queued, and stop the flusher."""
        with self._ready:
            self._closing = True
            thread = self._thread
            self._ready.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # -- the flusher --------------------------------------------------------------------------
    def _flush_loop(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if not self._queue:
                    return  # closing, and nothing left
                jobs = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            try:
                self._flush(jobs)
            except BaseException as error:  # never leave a caller waiting
                log.exception("group commit flusher failed")
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(error)

    def _flush(self, jobs: list[_Job]) -> None:
        jobs.sort(key=lambda job: job.order)
        try:
            outcomes = self.driver.run(lambda tx: _decide(tx, jobs))
        except DatabaseUnavailable as error:
            # Retries spent: each request alone would have met the same outage.
            for job in jobs:
                job.future.set_exception(error)
            return
        except Exception as error:  # a database error that is not transient
            if len(jobs) == 1:
                jobs[0].future.set_exception(error)
                return
            log.warning("a batch of %d failed (%s): deciding its requests one by one", len(jobs), error)
            self._count(len(jobs), fallback=True)
            self._one_by_one(jobs)
            return
        self._count(len(jobs))
        for job, outcome in zip(jobs, outcomes, strict=True):
            if isinstance(outcome, _Refused):
                job.future.set_exception(outcome.error)
            else:
                job.future.set_result(outcome)

    def _one_by_one(self, jobs: list[_Job]) -> None:
        for job in jobs:
            try:
                job.future.set_result(self.driver.run(job.step))
            except Exception as error:  # delivered to its caller
                job.future.set_exception(error)

    def _count(self, size: int, *, fallback: bool = False) -> None:
        s = self._stats
        self._stats = BatchStats(
            batches=s.batches + (0 if fallback else 1),
            requests=s.requests + (0 if fallback else size),
            largest=max(s.largest, 0 if fallback else size),
            fallbacks=s.fallbacks + (1 if fallback else 0),
        )


def _decide(tx: LedgerTx, jobs: Sequence[_Job]) -> list[Any]:
    """The batch's transaction: the function calls of the jobs that have one, in order and in
    one round trip; then, in order, the step of every other job and of every job whose call
    declined, each in its own savepoint. That is the order the batch decides them in."""
    decided: dict[int, Any] = {}
    planned: list[tuple[int, Quick[Any]]] = []
    for i, job in enumerate(jobs):
        if job.fast is not None:
            try:
                quick = job.fast(tx)
            except QuotaLedgerError:
                quick = None  # nothing written: the step decides, and raises what it must
            if quick is not None:
                planned.append((i, quick))
    if planned and tx.fast is not None:
        answers = tx.fast.pipelined([quick.call for _, quick in planned])
        for (i, quick), rows in zip(planned, answers, strict=True):
            value = quick.finish(rows)
            if value is not None:
                decided[i] = value
    outcomes: list[Any] = []
    for i, job in enumerate(jobs):
        if i in decided:
            outcomes.append(decided[i])
            continue
        hooks = len(tx.after_commit)
        savepoint = tx.conn.begin_nested()
        try:
            value = job.step(tx)
        except QuotaLedgerError as refusal:
            savepoint.rollback()
            del tx.after_commit[hooks:]  # what the refused step meant to do after commit
            outcomes.append(_Refused(refusal))
        else:
            savepoint.commit()
            outcomes.append(value)
    return outcomes
