"""How one batch's transaction decides its requests (see :mod:`quota_ledger.ledger.group_commit`).

On PostgreSQL a batch sends its function calls in one pipelined round trip before any other
step: the requests that a set function may decide (a :class:`ByFunction`: the reserves of one
partition and configuration version, the whole commits) go as one call for each group of them
(``quota_ledger_reserve_many``, ``quota_ledger_commit_many``), one statement per step whatever
their number, each counter updated once. A call never aborts the transaction: what it declines,
its request's step decides.

On MariaDB and SQLite requests that can be decided as a set (a :class:`Together`: the
keyless reserves of one partition, tracked ones and first uses included, the whole commits) are
decided by one Python function for all of them, with a few statements whatever their number,
before any step. What it leaves out, its request's step decides. A ledger error, or a database
error that is not a conflict or a lost connection, undoes the set and leaves every request of
it to its step: the set takes a savepoint before its first write (a driver ``Undo``) and
goes back to it, so a set that only reads, or fails before it writes, costs no savepoint.

A request whose step raises a ledger error (:class:`OverQuota`, :class:`ReservationNotFound`,
...) is rolled back to its own savepoint and leaves the others alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from quota_ledger.driver.pg_cursor import Call, PgCursor
from quota_ledger.driver.tx import LedgerTx, set_failed
from quota_ledger.model.errors import QuotaLedgerError

T = TypeVar("T")
log = logging.getLogger("quota_ledger.group_commit")


@dataclass(frozen=True, slots=True)
class ByFunction(Generic[T]):
    """A request a PostgreSQL set function may decide: the requests of a batch with equal
    ``group`` go as one call of ``build`` over their ``params``, in batch order. The call returns
    a row for each request it decided, ending with the request's place in it (1-based), and
    declines the others without aborting the transaction (their steps decide them); ``finish``
    says what a request's rows mean (None: declined)."""

    group: tuple[Any, ...]
    params: Mapping[str, Any]
    build: Callable[[list[Mapping[str, Any]]], Call]
    finish: Callable[[list[Any]], T | None]


@dataclass(frozen=True, slots=True)
class Together(Generic[T]):
    """How a request like this one is decided with others off PostgreSQL: those of a batch with
    equal ``group`` (two or more) go as one ``decide`` of their ``member`` values, in batch
    order, inside a savepoint of their own. ``decide`` returns the outcome of each member it
    decided (its value, or its :class:`Refused` error), by its place in the list (0-based); each
    other member's step decides it after. It decides exactly as the steps of the members it
    decided would, run one after another."""

    group: tuple[Any, ...]
    member: Any
    #: undoes what it wrote when it raises (see :class:`~quota_ledger.driver.tx.Undo`)
    decide: Callable[[LedgerTx, list[Any]], Mapping[int, T | Refused]]


class Refused:
    """A step's ledger error, delivered to its caller once the batch has committed."""

    __slots__ = ("error",)

    def __init__(self, error: QuotaLedgerError) -> None:
        self.error = error


class Job(Protocol):
    """A request of a batch, as its transaction sees it."""

    @property
    def step(self) -> Callable[[LedgerTx], Any]: ...

    @property
    def by_function(self) -> Callable[[LedgerTx], ByFunction[Any] | None] | None: ...

    @property
    def together(self) -> Together[Any] | None: ...


def decide(tx: LedgerTx, jobs: Sequence[Job]) -> list[Any]:
    """The batch's transaction: the function calls of the jobs that have one, in one round trip;
    off PostgreSQL the sets of jobs decided together; then, in order, the step of every other
    job and of every job whose call or set left it out, each in its own savepoint. That is the
    order the batch decides them in."""
    decided: dict[int, Any] = {}
    planned: list[tuple[int, ByFunction[Any]]] = []
    for i, job in enumerate(jobs):
        if job.by_function is not None:
            try:
                call = job.by_function(tx)
            except QuotaLedgerError:
                call = None  # nothing written: the step decides, and raises what it must
            if call is not None:
                planned.append((i, call))
    if planned and tx.pg is not None:
        _call(tx.pg, planned, decided)
    if tx.pg is None:
        _together(tx, jobs, decided)
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
            outcomes.append(Refused(refusal))
        else:
            savepoint.commit()
            outcomes.append(value)
    return outcomes


def _together(tx: LedgerTx, jobs: Sequence[Job], decided: dict[int, Any]) -> None:
    """Decide each set of two or more jobs with equal :attr:`Together.group` by one call of its
    ``decide`` (sets in the order of their first job), and put what it decided in ``decided``.
    A set that raises a ledger error or a database error the database meant (not a conflict or
    a lost connection: those fail the attempt, which the driver runs again) has undone what it
    wrote (:class:`~quota_ledger.driver.tx.Undo`): its jobs' steps decide them."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, job in enumerate(jobs):
        if job.together is not None and i not in decided:
            groups.setdefault(job.together.group, []).append(i)
    for members in groups.values():
        if len(members) < 2:
            continue
        sets = [each for i in members if (each := jobs[i].together) is not None]
        try:
            values = sets[0].decide(tx, [each.member for each in sets])
        except Exception as error:
            if not set_failed(error):
                raise
            if not isinstance(error, QuotaLedgerError):
                log.warning("a set of %d failed (%s): deciding its requests one by one", len(members), error)
            continue
        for n, value in values.items():
            decided[members[n]] = value


def _call(cursor: PgCursor, planned: Sequence[tuple[int, ByFunction[Any]]], decided: dict[int, Any]) -> None:
    """Send one call for each group of ``planned`` (in the order of its first request), all in
    one round trip, and put what they decided in ``decided``."""
    groups: dict[tuple[Any, ...], list[tuple[int, ByFunction[Any]]]] = {}
    for i, call in planned:
        groups.setdefault(call.group, []).append((i, call))
    members = list(groups.values())
    sends = [group[0][1].build([call.params for _, call in group]) for group in members]
    for group, rows in zip(members, cursor.pipelined(sends), strict=True):
        # a row for each request the call decided, ending with its place (1-based)
        by_place: dict[int, list[Any]] = {}
        for row in rows:
            by_place.setdefault(row[-1] - 1, []).append(row)
        for n, (i, call) in enumerate(group):
            value = call.finish(by_place[n]) if n in by_place else None
            if value is not None:
                decided[i] = value
