"""Release: in-use resources leave the ledger (a pod is gone), never refused for a limit.

Either given amounts of a queue (:func:`release_in_use`, as YuniKorn's release of an
allocation) or everything a committed reservation holds, once (:func:`release_reservation`).
Releasing more than is in use raises :class:`UsageUnderflow` and changes nothing. Lock order
as for every path: the reservation row, the application row, then the counters.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import applications, resolve, waiting
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.model import charges, queues, tracking
from quota_ledger.model.errors import IdempotencyConflict, UsageUnderflow
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.values import Reservation, ReservationState

#: release keys name their operation in the journal by a name-based UUID in this namespace
_KEYED = uuid.UUID("6f1d3c1e-8d8a-4c55-9a4e-2f0b7f1e5a10")


def keyed_operation_id(partition: str, key: str) -> str:
    """The journal's operation id of the release made with ``key`` in ``partition``: the same
    on every call, so a repeated call (after a timeout, a failover) finds the first one."""
    return str(uuid.uuid5(_KEYED, f"release\x00{partition}\x00{key}"))


def release(
    tx: LedgerTx,
    partition: str,
    queue: str,
    amounts: Mapping[str, int],
    user: str | None,
    application: str | None,
    finished: bool,
    operation_id: str,
    key: str | None = None,
) -> None:
    """Return in-use ``amounts`` of ``queue``, once per ``operation_id``.

    With ``key`` (whose operation id is :func:`keyed_operation_id`), a release already made
    with that key returns without changing anything, and one made with the key for another
    request raises :class:`IdempotencyConflict`. The check runs after the first row lock the
    release takes, so of two concurrent calls with one key the second sees the first's entries.
    """
    if key is None and tx.attempt and tx.operation_recorded(operation_id):
        return  # the first attempt committed before the connection dropped
    wanted = {(queue, res): -amount for res, amount in amounts.items()}

    def applied() -> bool:
        done = tx.operation_changes(operation_id)
        if done and key is not None and done != wanted:
            raise IdempotencyConflict(partition, key, None)
        return bool(done)

    release_in_use(
        tx,
        partition,
        queue,
        amounts,
        user,
        application,
        finished,
        operation_id,
        tx.db_now(),
        applied=applied if key is not None else None,
    )


def release_reservation(
    tx: LedgerTx, rules: CompiledRules, reservation_id: str, finished: bool, operation_id: str
) -> Reservation:
    """Release everything a committed reservation holds, once; a pending one is rolled back, a
    waiting one taken out of line."""
    stored, now = resolve.locked(tx, reservation_id)
    current = stored.reservation
    if current.state is ReservationState.PENDING:
        return resolve.resolve_one(tx, rules, resolve.Resolution(stored, ReservationState.ROLLED_BACK), now)
    if current.state is ReservationState.WAITING:
        return waiting.cancel(tx, current, now)
    in_force = rules.partition(tx, current.partition)
    if current.state is not ReservationState.COMMITTED or current.released_at is not None:
        return current
    tx.mark_released(current.id, now)
    amounts = {res: v for res, v in (current.committed or {}).items() if v > 0}
    release_in_use(
        tx,
        current.partition,
        current.queue,
        amounts,
        current.user,
        current.application,
        finished,
        operation_id,
        now,
        reservation_id=current.id,
    )
    resolve.leave_quotas(tx, in_force, [stored], now)
    return replace(current, released_at=now.replace(tzinfo=UTC))


def release_in_use(
    tx: LedgerTx,
    partition: str,
    queue: str,
    amounts: Mapping[str, int],
    user: str | None,
    application: str | None,
    finished: bool,
    operation_id: str,
    now: datetime,
    reservation_id: str | None = None,
    applied: Callable[[], bool] | None = None,
) -> None:
    """Return in-use resources of ``queue`` (and of the user's application, if named).

    ``applied`` says whether this operation is already in the journal; it is asked once,
    right after the first row lock (the application row, else the queue's counters).
    """
    app = None
    stopped = False
    if applications.tracked(user, application):
        key = tracking.app_key(application, user, queue)
        app = tx.lock_apps(partition, [key]).get(key)
        if app is not None:
            if applied is not None and applied():
                return
            applied = None
            applications.check_owner(app, user, queue)
        if short := tracking.shortfalls(app, amounts):
            raise UsageUnderflow(partition, queue, short)
        if app is not None:
            tracking.release(app, amounts, now)
            # YuniKorn drops an application from its trackers once nothing of it is allocated.
            if finished or tracking.idle(app):
                stopped = applications.stop(tx, app, now, "Completed")
            tx.update_app(app)
    own = tx.lock_queue_counters(partition, [(queue, r) for r in amounts])
    if applied is not None and applied():
        return
    short = {
        res: (own[(queue, res)].in_use if (queue, res) in own else 0, amount)
        for res, amount in amounts.items()
        if (queue, res) not in own or own[(queue, res)].in_use < amount
    }
    if short:
        raise UsageUnderflow(partition, queue, short)
    resources = [*amounts, *([APPLICATIONS] if stopped else [])]
    limits = tx.lock_subtree_counters(partition, queues.lineage(queue), resources)
    scoped = applications.charges(app, applications.lock_of(tx, [app], resources)) if app is not None else []
    given_back = charges.releasing([*own.values(), *limits, *scoped], amounts, stopped=stopped)
    tx.apply_charges(
        charges.decide_one(charges.Ask(partition, given_back, enforced=False)).admit().deltas, now
    )
    tx.append_journal(
        partition,
        queue,
        {res: -amount for res, amount in amounts.items()},
        kind="release",
        operation_id=operation_id,
        reservation_id=reservation_id,
        now=now,
    )
