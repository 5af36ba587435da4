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
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from quota_ledger.config.rules import Rules
from quota_ledger.driver import line_notices, pg_functions
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.pg_cursor import Call
from quota_ledger.driver.tx import LedgerTx, Undo
from quota_ledger.driver.waiting_line import Entry, Waiting
from quota_ledger.ledger import reserve, reserve_function
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
    now, last, version = tx.clock_last_and_version(request.partition)
    if behind and last is None:
        return None  # nobody waits: decided at once (without the partition's exclusive lock)
    if rules.partition(tx, request.partition, version).has_strict_lines:
        tx.lock_partition(request.partition, exclusive=True)
        now, last = tx.clock_and_last_queued(request.partition)  # (again, under the lock)
        if behind and last is None:
            return None
    made = request.pending(now)
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
    outcome = _decide(tx, rules, bounds, _stored_request(stored, entry), now)
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
    request = _stored_request(stored, entry)
    if tx.has_function(pg_functions.GRANT_FUNCTION):
        granted = function_grant(tx, rules.known(lambda read: read(tx)), request)
        if granted is not None:  # (what the function declines, the rule decides)
            return granted if isinstance(granted, Granted) else None
    outcome = _decide(tx, rules, bounds, request, now)
    return outcome if isinstance(outcome, Granted) else None


def _ran_out(waiting: Reservation, now: datetime) -> bool:
    """Whether the wait of a waiting request ran out by ``now`` (the database clock)."""
    return waiting.expires_at.replace(tzinfo=None) <= now.replace(tzinfo=None)


def _stored_request(stored: StoredReservation, entry: Entry) -> ReserveRequest:
    """The request a waiting row holds (read with its place in line), as its grant decides it."""
    current = stored.reservation
    assert entry.ttl_ms is not None
    return ReserveRequest(
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


def _decide(
    tx: LedgerTx, rules: CompiledRules, bounds: validation.Bounds, request: ReserveRequest, now: datetime
) -> Granted | Refused:
    """Decide a waiting request this transaction holds, by the rule a new reserve runs: its
    grant (notified at commit), or its refusal, which leaves the transaction as it was."""
    # A savepoint only before a write that is not the grant's own (a first use's counter): a
    # refusal leaves the transaction as it was.
    undo = Undo(tx)
    try:
        made, again = reserve.grant(tx, rules, bounds, request, undo)
    except QuotaLedgerError as refused:
        undo.rollback()
        return Refused(refused)
    undo.release()
    tx.notify_left(request.partition, request.reservation_id)
    return Granted(made, _waited(request, now), full=again is False)


def _waited(request: ReserveRequest, now: datetime) -> float:
    """How long a granted request waited, from joining its line to its grant at ``now``."""
    assert request.queued_at is not None
    return max(0.0, (now.replace(tzinfo=UTC) - request.queued_at).total_seconds())


def grant_by_function(
    driver: DbQuotaDriver, rules: CompiledRules, each: Waiting
) -> Granted | Left | Over | None:
    """PostgreSQL: grant the waiting request ``each`` (as a pass read it) in one call of
    ``quota_ledger_grant``, which decides by ``quota_ledger_reserve_many``, as a new reserve of
    the same request is decided, and writes what :func:`grant` writes; :data:`LEFT` when it no
    longer waits, :data:`OVER` when it is over a limit; None when it declined
    (nothing was written: :func:`grant` decides), or when it is left to :func:`grant` without a
    call: a partition with a ``StrictFIFO`` queue (its lines are read by the rule), a request
    the admission rules may refuse, or a database without the function (a schema before 0019)."""
    if each.ttl_ms is None or not driver.has_function(pg_functions.GRANT_FUNCTION):
        return None
    request = line_request(each)
    call = _grant_call(rules.known(driver.run), request)
    if call is None:
        return None
    return _granted(request, driver.call(call.sql, call.params))


def function_grant(tx: LedgerTx, known: Rules, request: ReserveRequest) -> Granted | Left | Over | None:
    """:func:`grant_by_function` for the waiting ``request`` in ``tx`` (PostgreSQL, a schema
    with the function), under the rules ``known``."""
    call = _grant_call(known, request)
    return None if call is None else _granted(request, tx.grant_by_function(call.sql, call.params))


def _grant_call(known: Rules, request: ReserveRequest) -> Call | None:
    """The ``quota_ledger_grant`` call that grants the waiting ``request`` under the rules
    ``known``; None when the rule decides it (see :func:`grant_by_function`)."""
    if not request.resources or known.partition(request.partition).has_strict_lines:
        return None
    found = reserve_function.params(known, request)
    if found is None:
        return None
    # The call's own reservation is a stand-in for the waiting row (a fresh id, no key): the
    # function moves its charges to the waiting row and deletes it.
    stand_in = {**found, "id": str(uuid.uuid4()), "key": None}
    notice = line_notices.payload(request.partition, request.reservation_id)
    params = pg_functions.reserve_many([stand_in]).params
    return Call(pg_functions.GRANT, {**params, "grant": request.reservation_id, "notice": notice})


class Left:
    """What :func:`grant_by_function` answers for a request that no longer waits: another
    transaction decided it, and its callers hear of it from that one."""


class Over:
    """What :func:`grant_by_function` answers for a request it found over a limit it is
    charged to, under the configuration in force: refused, as the rule would refuse it (what
    stopped it is not read again: a pass skips it, and what asks no less, as after a refusal)."""


LEFT = Left()
OVER = Over()


def _granted(request: ReserveRequest, rows: list[Any] | None) -> Granted | Left | Over | None:
    """What ``quota_ledger_grant`` answered with ``rows`` (None: it declined)."""
    if not rows:
        return None
    found = rows[0]
    if found.outcome == "left":
        return LEFT
    if found.outcome == "over":
        return OVER
    now: datetime = found.created_at
    return Granted(request.pending(now), _waited(request, now), full=found.again is False)


def line_request(each: Waiting) -> ReserveRequest:
    """The request a waiting row holds, as a pass read it, as its grant decides it."""
    assert each.ttl_ms is not None
    return ReserveRequest(
        reservation_id=each.id,
        partition=each.partition,
        queue=each.queue,
        resources=dict(each.needs),
        user=each.user,
        groups=tuple(json.loads(each.groups)) if each.groups else (),
        application=each.application,
        priority_class=each.priority_class,
        key=each.key,
        request_hash="",
        ttl_seconds=each.ttl_ms / 1000,
        kube=json.loads(each.kube) if each.kube else {"usage": {}, "scopes": {}},
        namespace=each.queue.rsplit(".", 1)[-1],
        priority=each.priority,
        granting=True,
        queued_at=each.queued_at,
    )


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
