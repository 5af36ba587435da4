"""Resolving reservations: commit, rollback and expiry, inside the ledger's transactions.

A pending reservation is resolved exactly once. Its own rows are written first, then its
application row, then the shared counters in the canonical lock order (see
:mod:`quota_ledger.driver.tx`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from quota_ledger.config.rules import PartitionRules
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.kube.quotas import ResourceQuota
from quota_ledger.ledger import applications, resource_quotas
from quota_ledger.model import limits as limit_rules
from quota_ledger.model import queues, tracking
from quota_ledger.model.errors import ReservationStateError, UsageUnderflow
from quota_ledger.model.limits import Counter
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Reservation, ReservationState, StoredReservation

summary_log = logging.getLogger("quota_ledger.summary")


def stop(tx: LedgerTx, app: AppState, now: datetime, how: str) -> bool:
    """Finish a running application; True when it counted as running (a named one)."""
    summary = tracking.finish(app, now, how)
    if summary is None:
        return False
    tx.insert_summary(app.partition, summary, now)
    line = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    tx.after_commit.append(lambda: summary_log.info("QUOTA_APP_SUMMARY: %s", line))
    return True


def reserve_delta(counter: Counter, requested: Mapping[str, int]) -> tuple[int, int]:
    """A running-application count is in use at once; resources are reserved."""
    if counter.resource == APPLICATIONS:
        return requested[APPLICATIONS], 0
    return 0, requested[counter.resource]


def by_key(counters: Iterable[Counter]) -> dict[tuple[str, str], Counter]:
    return {(c.scope, c.resource): c for c in counters}


def counters_of(
    reservation: Reservation,
    own: Mapping[tuple[str, str], Counter],
    limits: Mapping[tuple[str, str], Counter],
    *,
    stopped: bool = False,
) -> list[Counter]:
    """The locked counters a reservation is charged to: its queue's and its lineage's limits,
    and the lineage's application counts when its application stops running."""
    chain = queues.lineage(reservation.queue)
    found = []
    for resource in reservation.resources:
        if (mine := own.get((reservation.queue, resource))) is not None:
            found.append(mine)
        found += [c for scope in chain if (c := limits.get((scope, resource))) is not None]
    if stopped:
        found += [c for scope in chain if (c := limits.get((scope, APPLICATIONS))) is not None]
    return found


def resolve(
    tx: LedgerTx,
    stored: StoredReservation,
    state: ReservationState,
    committed: Mapping[str, int],
    now: datetime,
    operation_id: str,
    rules: PartitionRules | None = None,
) -> Reservation:
    """Move a locked pending reservation to ``state`` and adjust its counters.

    The reservation's own rows (already locked) and the journal (new rows) are written
    first; the shared counters are locked last, so they are held for the shortest time.
    An application whose last reservation goes away with nothing in use stops running; a
    reservation that goes away uncommitted leaves the ResourceQuotas that count it (``rules``).
    """
    reservation = stored.reservation
    if not tx.resolve_reservation(reservation.id, state, now):
        raise ReservationStateError(reservation.id, reservation.state, state.value)
    if state is ReservationState.COMMITTED:
        tx.record_commits(reservation.id, committed, whole=committed == reservation.resources)
        tx.append_journal(
            reservation.partition,
            reservation.queue,
            committed,
            kind="commit",
            operation_id=operation_id,
            reservation_id=reservation.id,
            now=now,
        )
    app = None
    stopped = False
    if applications.tracked(reservation.user, reservation.application):
        app = tx.lock_apps(reservation.partition, [applications.key_of(reservation)]).get(
            applications.key_of(reservation)
        )
    if app is not None:
        tracking.resolve(app, reservation.resources, committed, now)
        if state is not ReservationState.COMMITTED and tracking.idle(app):
            how = "Expired" if state is ReservationState.EXPIRED else "RolledBack"
            stopped = stop(tx, app, now, how)
        tx.update_app(app)
    resources = [*reservation.resources, *([APPLICATIONS] if stopped else [])]
    pairs = [(reservation.queue, res) for res in reservation.resources]
    own = tx.lock_queue_counters(reservation.partition, pairs, create_missing=False)
    limits = tx.lock_subtree_counters(reservation.partition, queues.lineage(reservation.queue), resources)
    counters = counters_of(reservation, own, by_key(limits), stopped=stopped)
    scoped = applications.charges(app, applications.lock_of(tx, [app], resources)) if app is not None else []
    limit_rules.check_overflow(committed, [*counters, *scoped], field="in_use")

    def delta(c: Counter) -> tuple[int, int]:
        if c.resource == APPLICATIONS:
            return -1, 0
        return committed.get(c.resource, 0), -reservation.resources[c.resource]

    tx.apply_counter_deltas({c.id: delta(c) for c in counters}, now)
    tx.apply_identity_deltas({c.id: delta(c) for c in scoped}, now)
    if state is not ReservationState.COMMITTED and rules is not None:
        leave_quotas(tx, rules, [stored], now)
    return replace(
        reservation,
        state=state,
        committed=dict(committed) if state is ReservationState.COMMITTED else None,
        resolved_at=now.replace(tzinfo=UTC),
    )


def leave_quotas(
    tx: LedgerTx, rules: PartitionRules, stored: Sequence[StoredReservation], now: datetime
) -> None:
    """Take reservations (locked, leaving the live set) out of the quotas that count them now."""
    by_quota: list[tuple[StoredReservation, list[ResourceQuota]]] = []
    for each in stored:
        found = resource_quotas.matching(rules, each.reservation.queue, each.kube)
        if found:
            by_quota.append((each, found))
    if not by_quota:
        return
    names = {(resource_quotas.QUOTA, q.key) for _, qs in by_quota for q in qs}
    queue_set = {each.reservation.queue for each, _ in by_quota}
    resources = {name for each, _ in by_quota for name in (each.kube or {}).get("usage", {})}
    counters = tx.lock_identity_counters(rules.name, names, queue_set, resources)
    deltas: dict[int, tuple[int, int]] = {}
    for each, quotas in by_quota:
        keys = {q.key for q in quotas}
        usage = (each.kube or {})["usage"]
        for counter in counters:
            if counter.name in keys and counter.scope == each.reservation.queue and counter.resource in usage:
                applications.add_delta(deltas, counter, -usage[counter.resource], 0)
    tx.apply_identity_deltas(deltas, now)


def expire_batch(
    tx: LedgerTx, partition: str, batch_size: int, rules_of: Callable[[LedgerTx], PartitionRules]
) -> int:
    now = tx.db_now()
    stored = tx.lock_expired(partition, batch_size, now)
    if not stored:
        return 0
    rules = rules_of(tx)
    expiring = [s.reservation for s in stored]
    keys = {applications.key_of(r) for r in expiring if applications.tracked(r.user, r.application)}
    apps = tx.lock_apps(partition, keys)
    for reservation in expiring:
        if (app := apps.get(applications.key_of(reservation))) is not None:
            tracking.resolve(app, reservation.resources, {}, now)
    stopping = [a for a in apps.values() if tracking.idle(a) and stop(tx, a, now, "Expired")]
    for app in apps.values():
        tx.update_app(app)
    pairs = {(r.queue, res) for r in expiring for res in r.resources}
    resources = {res for _, res in pairs} | ({APPLICATIONS} if stopping else set())
    own = tx.lock_queue_counters(partition, pairs, create_missing=False)
    scopes = {scope for r in expiring for scope in queues.lineage(r.queue)}
    limits = by_key(tx.lock_subtree_counters(partition, scopes, resources))
    scoped = applications.lock_of(tx, apps.values(), resources)
    deltas: dict[int, tuple[int, int]] = {}
    identity_deltas: dict[int, tuple[int, int]] = {}
    for reservation in expiring:
        for counter in counters_of(reservation, own, limits):
            applications.add_delta(deltas, counter, 0, -reservation.resources[counter.resource])
        if (app := apps.get(applications.key_of(reservation))) is not None:
            for named in applications.charges(app, scoped):
                if (amount := reservation.resources.get(named.resource)) is not None:
                    applications.add_delta(identity_deltas, named, 0, -amount)
    for app in stopping:
        for scope in queues.lineage(app.queue):
            if (count := limits.get((scope, APPLICATIONS))) is not None:
                applications.add_delta(deltas, count, -1, 0)
        for named in applications.charges(app, scoped):
            if named.resource == APPLICATIONS:
                applications.add_delta(identity_deltas, named, -1, 0)
    tx.apply_counter_deltas(deltas, now)
    tx.apply_identity_deltas(identity_deltas, now)
    leave_quotas(tx, rules, stored, now)
    return tx.expire_reservations([r.id for r in expiring], now)


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
) -> None:
    """Return in-use resources of ``queue`` (and of the user's application, if named)."""
    app = None
    stopped = False
    if applications.tracked(user, application):
        key = tracking.app_key(application, user, queue)
        app = tx.lock_apps(partition, [key]).get(key)
        if app is not None:
            applications.check_owner(app, user, queue)
        if short := tracking.shortfalls(app, amounts):
            raise UsageUnderflow(partition, queue, short)
        if app is not None:
            tracking.release(app, amounts, now)
            # YuniKorn drops an application from its trackers once nothing of it is allocated.
            if finished or tracking.idle(app):
                stopped = stop(tx, app, now, "Completed")
            tx.update_app(app)
    own = tx.lock_queue_counters(partition, [(queue, r) for r in amounts], create_missing=False)
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

    def delta(c: Counter) -> tuple[int, int]:
        return (-1, 0) if c.resource == APPLICATIONS else (-amounts[c.resource], 0)

    tx.apply_counter_deltas({c.id: delta(c) for c in [*own.values(), *limits]}, now)
    tx.apply_identity_deltas({c.id: delta(c) for c in scoped}, now)
    tx.append_journal(
        partition,
        queue,
        {res: -amount for res, amount in amounts.items()},
        kind="release",
        operation_id=operation_id,
        reservation_id=reservation_id,
        now=now,
    )
