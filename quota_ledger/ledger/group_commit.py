"""Group commit: many concurrent requests decided by one database transaction.

Each call that reaches a hot queue costs one transaction, one durable write (a WAL flush, a
redo log flush) and one hold of the queue's counter locks; threads on one queue queue up behind
each other's commits. With group commit the calling threads put their requests (a *step*: a
function of one :class:`LedgerTx`) on a queue, and one transaction at a time per engine takes
whatever has queued, up to ``max_batch`` requests, and runs them, each inside its own
savepoint. A request whose step raises a ledger error (:class:`OverQuota`,
:class:`ReservationNotFound`, ...) is rolled back to its savepoint and leaves the others alone,
so a batch decides exactly what its requests, run one after another, would have decided.

How one batch's transaction decides its requests (a set call for many on PostgreSQL, a
set function on MariaDB and SQLite, then each remaining request's step) is
:mod:`quota_ledger.ledger.group_decision`.

Every caller learns its outcome only after the batch's transaction has committed. The driver
retries the whole batch on a deadlock, a serialization failure or a lost connection (every step
is written to be run again; ``tx.attempt`` tells it a first attempt may have committed). Any
other database error (a request the database itself rejects) would fail the whole batch: its
requests are then decided again one transaction each, so each gets its own outcome.

There is no timer and no window, and no thread of its own: a caller that finds no batch under
way leads, and starts a transaction at once; the requests that arrive while it runs make up
the next batch, which the leader also decides if its own request is among them, or hands to
the oldest waiting caller. A quiet ledger so runs each call in its caller's thread as without
batching (no hand-over between threads, measured: a dedicated flusher thread doubled the
median latency of a lone caller), and a busy one gets larger batches. One thread may also put
many requests on the queue at once and wait for all of their outcomes
(:meth:`GroupCommit.run_many`: the service's ``POST /v1/batch``, without a thread per
operation); it leads as any caller does, until every one of its requests is decided.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from quota_ledger.driver import pg_functions
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger.group_decision import ByFunction, Refused, Together, decide
from quota_ledger.model.errors import DatabaseUnavailable

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
class Deciders(Generic[T]):
    """What may decide one request of a batch (the arguments of :meth:`GroupCommit.run`, as a
    value for :meth:`GroupCommit.run_many`); :class:`~quota_ledger.ledger.paths.Paths` builds it."""

    #: decides the request inside the batch's transaction, in a savepoint of its own
    step: Callable[[LedgerTx], T]
    #: where it goes in its batch (requests on one queue side by side)
    order: tuple[str, ...] = ()
    #: which function call may decide it now (PostgreSQL), if any (None: none)
    by_function: Callable[[LedgerTx], ByFunction[T] | None] | None = None
    #: how it is decided when it is alone in its batch (default: ``step`` in a transaction of
    #: its own)
    alone: Callable[[], T] | None = None
    #: how it is decided with others like it on MariaDB and SQLite, if it can be (None: no)
    together: Together[T] | None = None


class _Caller:
    """A thread waiting for its requests: woken once all of them are decided, or to lead."""

    __slots__ = ("undecided", "wake")

    def __init__(self, undecided: int) -> None:
        self.undecided = undecided
        self.wake = threading.Event()


@dataclass(eq=False)
class _Job:
    step: Callable[[LedgerTx], Any]
    #: jobs of a batch run in this order (stable): requests on one queue together
    order: tuple[str, ...]
    #: the request's function call, if it has one now (PostgreSQL)
    by_function: Callable[[LedgerTx], ByFunction[Any] | None] | None
    #: how the request is decided alone (default: ``step`` in a transaction of its own)
    alone: Callable[[], Any] | None
    #: the set it may be decided with (MariaDB, SQLite)
    together: Together[Any] | None
    #: the thread waiting for it (only the leader decides jobs, so only it counts them down)
    caller: _Caller
    done: bool = False
    value: Any = None
    error: BaseException | None = None

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error, self.done = value, error, True
        self.caller.undecided -= 1
        if self.caller.undecided == 0:
            self.caller.wake.set()


class GroupCommit:
    """The request queue of one engine, and which of its callers leads the batches now."""

    def __init__(self, driver: DbQuotaDriver, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self.driver = driver
        self.max_batch = max_batch
        self._queue: deque[_Job] = deque()
        self._lock = threading.Lock()
        #: notified when no one leads and nothing is queued (for close)
        self._idle = threading.Condition(self._lock)
        self._leading = False
        self._closing = False
        self._stats = BatchStats()
        self._functions: bool | None = None

    @property
    def stats(self) -> BatchStats:
        """Batches and requests decided so far."""
        return self._stats

    @property
    def pending(self) -> int:
        """Requests waiting for a batch (not counting those being decided)."""
        with self._lock:
            return len(self._queue)

    @property
    def functions(self) -> bool:
        """Whether a batch may call the PostgreSQL set functions (revision 0012 and later);
        asked of the database once."""
        if self._functions is None:
            installed = self.driver.functions and self.driver.run(
                lambda tx: pg_functions.set_functions_installed(tx.conn)
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
        by_function: Callable[[LedgerTx], ByFunction[T] | None] | None = None,
        alone: Callable[[], T] | None = None,
        together: Together[T] | None = None,
    ) -> T:
        """Decide ``step`` in the next batch; its value once that batch has committed, or its
        error. ``order``: where it goes in its batch (requests on one queue side by side).
        ``by_function``, when given, says which function call may decide the request (None: none);
        a batch sends all of its calls in one round trip before it runs any step. ``alone``
        decides the request when it is the only one queued (default: ``step`` in a
        transaction of its own): exactly as without batching, at no cost of its own.
        ``together``, when given, says how it may be decided with others like it (MariaDB,
        SQLite).

        The caller that finds no batch under way leads: it decides what is queued, its own
        request with it, batch after batch until its own is decided, then hands the lead to
        the caller of the oldest request still queued. The others wait for their outcome (or
        the lead)."""
        (job,) = self._submit([Deciders(step, tuple(order), by_function, alone, together)])
        if job.error is not None:
            raise job.error
        result: T = job.value
        return result

    def run_many(self, requests: Sequence[Deciders[T]]) -> list[T | Exception]:
        """Decide many requests from one thread, as :meth:`run` decides one: each in its own
        savepoint, with the outcome it would have had alone. Returns, in the order given, each
        request's value or its error, once every batch that decided them has committed.
        Requests beyond ``max_batch`` go to the batches after."""
        outcomes: list[T | Exception] = []
        for job in self._submit(requests):
            if job.error is None:
                outcomes.append(job.value)
            elif isinstance(job.error, Exception):
                outcomes.append(job.error)
            else:
                raise job.error
        return outcomes

    def _submit(self, requests: Sequence[Deciders[Any]]) -> list[_Job]:
        """Queue the requests; return their jobs once all are decided, leading when no one
        does (or when handed the lead)."""
        caller = _Caller(len(requests))
        jobs = [_Job(r.step, tuple(r.order), r.by_function, r.alone, r.together, caller) for r in requests]
        if not jobs:
            return jobs
        with self._lock:
            if self._closing:
                raise DatabaseUnavailable("the engine is closed")
            self._queue.extend(jobs)
            lead = not self._leading
            self._leading = True
        if not lead:
            caller.wake.wait()
        if caller.undecided:  # woken to lead
            self._lead(caller)
        return jobs

    def close(self) -> None:
        """Stop taking requests; return once those already queued are decided."""
        with self._lock:
            self._closing = True
            while self._leading or self._queue:
                self._idle.wait()

    # -- leading ------------------------------------------------------------------------------
    def _lead(self, caller: _Caller) -> None:
        try:
            while caller.undecided:
                with self._lock:
                    jobs = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
                try:
                    self._flush(jobs)
                except BaseException as error:  # never leave a caller waiting
                    log.exception("a batch failed")
                    for job in jobs:
                        if not job.done:
                            job.resolve(error=error)
                    raise
        finally:
            with self._lock:
                if caller.undecided:
                    # Leaving on an error: the caller's requests still queued are not decided.
                    self._queue = deque(job for job in self._queue if job.caller is not caller)
                if self._queue:
                    self._queue[0].caller.wake.set()
                else:
                    self._leading = False
                    self._idle.notify_all()

    def _flush(self, jobs: list[_Job]) -> None:
        if len(jobs) == 1:
            self._one_by_one(jobs, counted=True)
            return
        jobs.sort(key=lambda job: job.order)
        try:
            outcomes = self.driver.run(lambda tx: decide(tx, jobs))
        except DatabaseUnavailable as error:
            # Retries spent: each request alone would have met the same outage.
            for job in jobs:
                each = DatabaseUnavailable(str(error))  # one per caller: raised in its thread
                each.__cause__ = error
                job.resolve(error=each)
            return
        except Exception as error:  # a database error that is not transient
            log.warning("a batch of %d failed (%s): deciding its requests one by one", len(jobs), error)
            self._count(len(jobs), fallback=True)
            self._one_by_one(jobs)
            return
        self._count(len(jobs))
        for job, outcome in zip(jobs, outcomes, strict=True):
            if isinstance(outcome, Refused):
                job.resolve(error=outcome.error)
            else:
                job.resolve(outcome)

    def _one_by_one(self, jobs: list[_Job], *, counted: bool = False) -> None:
        """Decide each job alone; ``counted``: each as a batch of one, unless the database
        could not be reached."""
        for job in jobs:
            try:
                job.resolve(job.alone() if job.alone is not None else self.driver.run(job.step))
            except Exception as error:  # delivered to its caller
                job.resolve(error=error)
            if counted and not isinstance(job.error, DatabaseUnavailable):
                self._count(1)

    def _count(self, size: int, *, fallback: bool = False) -> None:
        s = self._stats
        self._stats = BatchStats(
            batches=s.batches + (0 if fallback else 1),
            requests=s.requests + (0 if fallback else size),
            largest=max(s.largest, 0 if fallback else size),
            fallbacks=s.fallbacks + (1 if fallback else 0),
        )
