"""The waiting line: a request that does not fit may wait for capacity, in the database.

A waiting request is a reservation row in state ``waiting`` that holds nothing (no counter
counts it), in its partition's line, ordered by priority (higher first), then arrival, then id
(:mod:`quota_ledger.driver.waiting_line`). :func:`join` puts a request in line; :func:`grant`
decides one waiting request again, by the very rule a new reserve runs (:func:`reserve.general`
with the request's own row): admitted, the row becomes ``pending``, made now, its ttl counted
from now; refused, it stays in line and the transaction is as it was. A request whose wait ran
out leaves the line as ``expired``; one cancelled (a rollback) as ``rolled_back``.

Each grant is a transaction of its own that locks the waiting row first (step 3 of the lock
order), then decides as a reserve does, so a grant takes its locks in the order every other
call takes them. A pass over the line tries its requests in order, and a later request that
fits is granted even when an earlier one does not (best effort first-in first-out). A grant
also says whether the same request again would fit after it: when it would not, the pass skips
what asks no less, as the same caller, as it skips what asks no less than a refused one.

On PostgreSQL a transaction that frees capacity may end with :func:`grant_head`: the first
request of the line, decided by the same rule and written the same way, its lock waits bounded
(they come after the counters that transaction holds).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from quota_ledger.driver.tx import LedgerTx, Undo
from quota_ledger.driver.waiting_line import Entry, Waiting
from quota_ledger.ledger import reserve
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.group_decision import Refused
from quota_ledger.model import validation
from quota_ledger.model.errors import OverQuota, QuotaLedgerError
from quota_ledger.model.requests import ReserveRequest
from quota_ledger.model.values import Reservation, ReservationState, StoredReservation, Violation

WAITING = ReservationState.WAITING
#: how many requests of a line one pass tries at most, and how many it reads first
PASS_LIMIT = 1000
PASS_FIRST = 16


def join(
    tx: LedgerTx,
    rules: CompiledRules,
    request: ReserveRequest,
    wait_seconds: float,
    blocked: Sequence[Violation],
) -> Reservation:
    """Put ``request`` in its partition's line until ``wait_seconds`` from now, waiting in the
    lines of the limits ``blocked`` names; the reservation its idempotency key made already, if
    it made one (waiting, granted or resolved)."""
    joined = _join(tx, rules, request, wait_seconds, blocked, behind=False)
    assert joined is not None  # (only a join behind others returns None)
    return joined


def join_behind(
    tx: LedgerTx, rules: CompiledRules, request: ReserveRequest, wait_seconds: float, place: bool = True
) -> Reservation | None:
    """:func:`join`, only if requests wait in the partition's line already (None when none
    does: the request is decided at once). It joins behind them undecided, and a pass grants it
    in order, so that it cannot take capacity that a request ahead of it fits in. Without
    ``place`` its ``position`` is not read (a caller that blocks until the grant)."""
    return _join(tx, rules, request, wait_seconds, [], behind=True, place=place)


def _join(
    tx: LedgerTx,
    rules: CompiledRules,
    request: ReserveRequest,
    wait_seconds: float,
    blocked: Sequence[Violation],
    behind: bool,
    place: bool = True,
) -> Reservation | None:
    """See :func:`join` and :func:`join_behind`.

    In a partition with a ``StrictFIFO`` queue the request joins under the partition's exclusive
    lock: every reserve that decides after it sees it in line, and none that decided before it
    is still deciding."""
    found = reserve.made_before(tx, request)
    if found is not None:
        return found
    strict = rules.partition(tx, request.partition).has_strict_lines
    if behind and strict and tx.last_queued(request.partition) is None:
        return None  # nobody waits: decided at once, without the partition's exclusive lock
    if strict:
        tx.lock_partition(request.partition, exclusive=True)
    now, last = tx.clock_and_last_queued(request.partition)
    made = request.pending(now)
    if behind and last is None:
        return None
    # Arrival order is exact where the clock is coarse (SQLite's counts milliseconds): a request
    # joins after the last one that joined, by a microsecond at least.
    arrived = made.created_at if last is None else max(made.created_at, last + timedelta(microseconds=1))
    waiting = dataclasses.replace(
        made, state=WAITING, created_at=arrived, expires_at=arrived + timedelta(seconds=wait_seconds)
    )
    ttl_ms = round(request.ttl_seconds * 1000)
    tx.insert_waiting(waiting, request.request_hash, request.kube, ttl_ms, blocked)
    return placed(tx, waiting) if place else waiting


def placed(tx: LedgerTx, reservation: Reservation) -> Reservation:
    """``reservation`` with its place in line, if it waits."""
    if reservation.state is not WAITING:
        return reservation
    entry = tx.line_entry(reservation.id)
    if entry is None:
        return reservation
    ahead = tx.ahead_of(reservation.partition, reservation.id, entry)
    return dataclasses.replace(reservation, position=ahead + 1)


@dataclass(frozen=True, slots=True)
class Granted:
    """A waiting request :func:`grant` granted: its reservation, how long it waited, and
    whether it filled what it took."""

    reservation: Reservation
    waited: float
    #: whether the same request again would have been refused right after this grant: a pass
    #: then skips the requests that ask for no less, as the same caller (:func:`no_smaller`)
    full: bool = False


def grant(
    tx: LedgerTx, rules: CompiledRules, bounds: validation.Bounds, reservation_id: str
) -> Granted | Reservation | Refused | None:
    """Decide the waiting request ``reservation_id`` again: its grant, its refusal (it stays in
    line, nothing is written), the reservation as it is when it no longer waits (an expired wait
    ends here), or None when there is no such reservation."""
    locked = tx.lock_reservation(reservation_id)
    if locked is None:
        return None
    stored, now = locked
    current = stored.reservation
    if current.state is not WAITING:
        return current
    if _ran_out(current, now):
        return leave(tx, current, ReservationState.EXPIRED, now)
    entry = tx.line_entry(reservation_id)
    if entry is None or entry.ttl_ms is None:  # (the constraint of a waiting row: never)
        return None
    outcome = _decide(tx, rules, bounds, stored, entry, now)
    if isinstance(outcome, Refused):
        refused = outcome.error
        if isinstance(refused, OverQuota) and _limits(refused.violations) != _limits(entry.blocked):
            tx.set_blocked(current.id, refused.violations)
    return outcome


#: how long the grant in a freeing transaction may wait for a lock, seconds
HEAD_LOCK_WAIT = 0.01


def grant_head(
    tx: LedgerTx, rules: CompiledRules, bounds: validation.Bounds, partition: str
) -> Granted | None:
    """In a transaction that just freed capacity in ``partition`` (PostgreSQL, its last step):
    grant the first request of the partition's line, if it fits now, as :func:`grant` would
    (the same rule, the same row written, one notice at commit); None when nothing was granted
    (no line, another transaction holds the first request, it does not fit, or its wait ran
    out: a pass decides).

    The freeing transaction holds counters already, so the locks taken here (the waiting row,
    the partition lock, counters it does not hold yet) come after them, out of the canonical
    order: their waits are bounded by :data:`HEAD_LOCK_WAIT`, and a wait past it fails the
    attempt as a conflict. The driver runs the whole call again, without this step (only a
    first attempt grants here), so no deadlock can form."""
    if tx.backend != "postgresql" or tx.attempt:
        return None
    head = tx.lock_line_head(partition, HEAD_LOCK_WAIT)
    if head is None:
        return None
    stored, entry, now = head
    if entry.ttl_ms is None or _ran_out(stored.reservation, now):
        return None
    outcome = _decide(tx, rules, bounds, stored, entry, now)
    return outcome if isinstance(outcome, Granted) else None


def _ran_out(waiting: Reservation, now: datetime) -> bool:
    """Whether the wait of a waiting request ran out by ``now`` (the database clock)."""
    return waiting.expires_at.replace(tzinfo=None) <= now.replace(tzinfo=None)


def _decide(
    tx: LedgerTx,
    rules: CompiledRules,
    bounds: validation.Bounds,
    stored: StoredReservation,
    entry: Entry,
    now: datetime,
) -> Granted | Refused:
    """Decide a waiting request this transaction holds, by the rule a new reserve runs: its
    grant (notified at commit), or its refusal, which leaves the transaction as it was."""
    current = stored.reservation
    assert entry.ttl_ms is not None
    request = ReserveRequest(
        reservation_id=current.id,
        partition=current.partition,
        queue=current.queue,
        resources=dict(current.resources),
        user=current.user,
        groups=current.groups,
        application=current.application,
        priority_class=current.priority_class,
        key=current.key,
        request_hash=stored.request_hash,
        ttl_seconds=entry.ttl_ms / 1000,
        kube=stored.kube or {"usage": {}, "scopes": {}},
        namespace=current.queue.rsplit(".", 1)[-1],
        priority=current.priority,
        granting=True,
        queued_at=entry.queued_at,
    )
    # A savepoint only before a write that is not the grant's own (a first use's counter): a
    # refusal leaves the transaction as it was.
    undo = Undo(tx)
    try:
        made, again = reserve.grant(tx, rules, bounds, request, undo)
    except QuotaLedgerError as refused:
        undo.rollback()
        return Refused(refused)
    undo.release()
    tx.notify_left(current.partition, current.id)
    waited = (now.replace(tzinfo=UTC) - entry.queued_at).total_seconds()
    return Granted(made, max(0.0, waited), full=again is False)


def no_smaller(each: Waiting, refused: Waiting) -> bool:
    """Whether ``each`` would be refused now because ``refused`` just was (or was granted, and
    the same request again would not have been: :attr:`Granted.full`): the same queue, user,
    groups, application, priority class and Kubernetes scopes, and at least as much of every
    resource ``refused`` asks for (every limit that stopped ``refused`` stops ``each``; a
    strict line ahead of ``refused`` is ahead of ``each``). A pass skips such a request:
    capacity freed meanwhile kicks another pass."""
    return _caller(each) == _caller(refused) and all(
        each.needs.get(res, 0) >= amount for res, amount in refused.needs.items()
    )


def _caller(each: Waiting) -> tuple[str | None, ...]:
    return (each.queue, each.user, each.groups, each.application, each.priority_class, each.scopes)


def cancel(tx: LedgerTx, current: Reservation, now: datetime) -> Reservation:
    """Take a waiting request this transaction holds out of line, as ``rolled_back``."""
    return leave(tx, current, ReservationState.ROLLED_BACK, now)


def leave(tx: LedgerTx, current: Reservation, state: ReservationState, now: datetime) -> Reservation:
    """A waiting request this transaction holds leaves the line, as ``state``."""
    tx.leave_line([current.id], state.value, now)
    tx.notify_left(current.partition, current.id)
    return dataclasses.replace(current, state=state, resolved_at=now.replace(tzinfo=UTC))


def _limits(violations: Sequence[Violation]) -> set[tuple[str, str, str | None, str]]:
    """Which limits ``violations`` name (not what they saw of them)."""
    return {(v.kind, v.scope, v.name, v.resource) for v in violations}


def end_run_out(tx: LedgerTx, partition: str, limit: int) -> int:
    """End, as ``expired``, up to ``limit`` waiting requests of ``partition`` whose wait ran out;
    how many."""
    now = tx.db_now()
    ids = tx.waits_run_out(partition, now, limit)
    ended = tx.leave_line(ids, ReservationState.EXPIRED.value, now)
    if ended:
        tx.notify_left(partition)
    return ended
