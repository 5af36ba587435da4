"""How one batch's transaction decides its requests (see :mod:`quota_ledger.ledger.group_commit`).

On PostgreSQL a batch sends its function calls in one pipelined round trip before any other
step. Requests that can be decided as a set (a :class:`Many`: the reserves of one
partition, the whole commits) go as one call for all of them (``quota_ledger_reserve_many``,
``quota_ledger_commit_many``): one statement per step whatever their number, each counter
updated once. What such a call declines goes as each request's own guarded call in a second
round trip, and what that declines, its request's step decides. Other requests go as one
call each. While none of those has declined lately they go plain; one that declines aborts the
transaction, which then runs again with every such call guarded (``quota_ledger_try_*``: an
exception block, so a decline undoes only that call), as do the next batches: a guard is a
subtransaction, which costs about a third more server time a call.

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

from quota_ledger.driver import pg_functions
from quota_ledger.driver.pg_cursor import Call, PgCursor
from quota_ledger.driver.tx import LedgerTx, set_failed
from quota_ledger.model.errors import QuotaLedgerError

T = TypeVar("T")
log = logging.getLogger("quota_ledger.group_commit")


@dataclass(frozen=True, slots=True)
class Many:
    """How requests like this one are decided together by one call: those of a batch with
    equal ``group`` go as ``build`` of their plain calls' parameters, in batch order, and
    whether the call is to be guarded (see :class:`ByFunction`). The call returns a row for each
    request it decided, ending with the request's place in it (1-based); it declines the others
    without aborting the transaction (their steps decide them), or unguarded it may abort it
    as a plain call does."""

    group: tuple[Any, ...]
    build: Callable[[list[Mapping[str, Any]], bool], Call]


@dataclass(frozen=True, slots=True)
class ByFunction(Generic[T]):
    """A request decided by one call of a PostgreSQL function that is all or nothing by itself:
    ``call`` declines without aborting the transaction (``quota_ledger_try_*``, a
    subtransaction each), ``plain`` the same function without that guard, which aborts the
    transaction when it declines; and what their rows mean (None: declined, the request's
    step decides)."""

    call: Call
    plain: Call
    finish: Callable[[list[Any]], T | None]
    #: a call that decides this request together with others like it, when there are some
    many: Many | None = None


@dataclass(frozen=True, slots=True)
class Together(Generic[T]):
    """How a request like this one is decided with others off PostgreSQL: those of a batch with
    equal ``group`` (two or more) go as one ``decide`` of their ``member`` values, in batch
    order, inside a savepoint of their own. ``decide`` returns the outcome of each member it
    decided, by its place in the list (0-based); each other member's step decides it after.
    It decides exactly as the steps of the members it decided would, run one after another."""

    group: tuple[Any, ...]
    member: Any
    #: undoes what it wrote when it raises (see :class:`~quota_ledger.driver.tx.Undo`)
    decide: Callable[[LedgerTx, list[Any]], Mapping[int, T]]


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


def decide(tx: LedgerTx, jobs: Sequence[Job], *, plain: bool) -> list[Any]:
    """The batch's transaction: the function calls of the jobs that have one, in order and in
    one round trip (and the own guarded calls of those a call for many declined, in a second);
    off PostgreSQL the sets of jobs decided together; then, in order, the step of every other
    job and of every job whose call or set left it out, each in its own savepoint. That is the
    order the batch decides them in.
    ``plain``: calls that abort the transaction when they decline (``pg_functions.Declined``)."""
    decided: dict[int, Any] = {}
    planned: list[tuple[int, ByFunction[Any]]] = []
    for i, job in enumerate(jobs):
        if job.by_function is not None:
            try:
                quick = job.by_function(tx)
            except QuotaLedgerError:
                quick = None  # nothing written: the step decides, and raises what it must
            if quick is not None:
                planned.append((i, quick))
    if planned and tx.pg is not None:
        # What a call for many declines may be a case it leaves to each request's own call
        # (guarded, in a second round trip), which may decline it in turn: its step decides.
        aside = _call(tx.pg, _sends(planned, plain=plain), decided, plain=plain)
        if aside:
            _call(tx.pg, [(quick.call, [(i, quick)], False) for i, quick in aside], decided, plain=False)
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


Planned = list[tuple[int, ByFunction[Any]]]
#: calls to send, each with the requests it decides and whether it is a call for many
Sends = list[tuple[Call, Planned, bool]]


def _call(cursor: PgCursor, sends: Sends, decided: dict[int, Any], *, plain: bool) -> Planned:
    """Send ``sends`` in one round trip and put what they decided in ``decided``; the requests
    that a call for many declined. ``plain``: a decline that aborts the transaction raises
    :class:`~quota_ledger.driver.pg_functions.Declined`."""
    answers = pg_functions.pipelined(cursor, [call for call, _, _ in sends], plain=plain)
    aside: Planned = []
    for (_, members, together), rows in zip(sends, answers, strict=True):
        # a call for many answers with a row for each it decided, ending with its place
        by_member = {row[-1] - 1: [row] for row in rows} if together else {0: rows}
        for n, (i, quick) in enumerate(members):
            value = quick.finish(by_member[n]) if n in by_member else None
            if value is not None:
                decided[i] = value
            elif together:
                aside.append((i, quick))
    return aside


def _sends(planned: Planned, *, plain: bool) -> Sends:
    """The calls that decide ``planned``, in order, each with the requests it decides and
    whether it is a call for many: one for every group of two or more requests that can be
    decided together (where its first one was), and each other request's own call."""
    groups: dict[tuple[Any, ...], Planned] = {}
    for i, quick in planned:
        if quick.many is not None:
            groups.setdefault(quick.many.group, []).append((i, quick))
    sends: Sends = []
    for i, quick in planned:
        many = quick.many
        members = groups[many.group] if many is not None else []
        if many is not None and len(members) > 1:
            if members[0][0] == i:
                sends.append((many.build([q.plain.params for _, q in members], not plain), members, True))
        else:
            sends.append((quick.plain if plain else quick.call, [(i, quick)], False))
    return sends
