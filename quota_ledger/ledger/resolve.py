"""Commit and rollback: resolving a pending reservation, exactly once.

The general path (:func:`commit_general`, :func:`rollback`, a transaction of steps on
:class:`LedgerTx`) locks the reservation and its counters and asks the rule
(:mod:`quota_ledger.model.charges`) for the deltas. On PostgreSQL a whole commit may be decided
first by ``quota_ledger_commit_many``, alone or with its batch's whole commits; what it declines
(a reservation not found, not pending, past its expiry, or without its application row), the
general path decides and says which. Rollbacks and partial commits take the general path.

A pending reservation's own rows are written first, then its application row, then the shared
counters in the canonical lock order (see :mod:`quota_ledger.driver.tx`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from quota_ledger.config.rules import PartitionRules
from quota_ledger.driver import pg_functions
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.kube.quotas import ResourceQuota
from quota_ledger.ledger import applications, resource_quotas
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.group_decision import ByFunction
from quota_ledger.model import arguments, charges, queues, tracking
from quota_ledger.model.counters import QUOTA, Counter
from quota_ledger.model.errors import ReservationNotFound, ReservationStateError
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Reservation, ReservationState, StoredReservation

summary_log = logging.getLogger("quota_ledger.summary")


def stop(tx: LedgerTx, app: AppState, now: datetime, how: str) -> bool:
    """Finish a running application; True when it counted as running (a named one)."""
    summary = tracking.finish(app, now, how)
    if summary is None:
        return False
    tx.insert_summaries([summary], now)
    line = json.dumps(summary, sort_keys=True, separators=(",", ":"))
    tx.after_commit.append(lambda: summary_log.info("QUOTA_APP_SUMMARY: %s", line))
    return True


def by_key(counters: Iterable[Counter]) -> dict[tuple[str, str], Counter]:
    return {(c.scope, c.resource): c for c in counters}


class Charged(Protocol):
    """What a reservation, or a request for one, is charged by: its queue and its resources."""

    @property
    def queue(self) -> str: ...

    @property
    def resources(self) -> Mapping[str, int]: ...


def counters_of(
    charged: Charged,
    own: Mapping[tuple[str, str], Counter],
    limits: Mapping[tuple[str, str], Counter],
    *,
    applications: bool = False,
) -> list[Counter]:
    """The locked counters a reservation (or a request) is charged to: its queue's and its
    lineage's limits, and with ``applications`` the lineage's application counts (its
    application starts or stops running)."""
    chain = queues.lineage(charged.queue)
    found = []
    for resource in charged.resources:
        if (mine := own.get((charged.queue, resource))) is not None:
            found.append(mine)
        found += [c for scope in chain if (c := limits.get((scope, resource))) is not None]
    if applications:
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
    own = tx.lock_queue_counters(reservation.partition, pairs)
    limits = tx.lock_subtree_counters(reservation.partition, queues.lineage(reservation.queue), resources)
    counters = counters_of(reservation, own, by_key(limits), applications=stopped)
    scoped = applications.charges(app, applications.lock_of(tx, [app], resources)) if app is not None else []
    resolved = charges.resolving([*counters, *scoped], reservation.resources, committed, stopped=stopped)
    tx.apply_charges(
        charges.decide_one(charges.Ask(reservation.partition, resolved, enforced=False)).admit().deltas, now
    )
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
    names = {(QUOTA, q.key) for _, qs in by_quota for q in qs}
    queue_set = {each.reservation.queue for each, _ in by_quota}
    resources = {name for each, _ in by_quota for name in (each.kube or {}).get("usage", {})}
    counters = tx.lock_identity_counters(rules.name, names, queue_set, resources)
    asks = []
    for each, quotas in by_quota:
        keys = {q.key for q in quotas}
        usage = (each.kube or {})["usage"]
        counted = [
            c
            for c in counters
            if c.name in keys and c.scope == each.reservation.queue and c.resource in usage
        ]
        asks.append(charges.Ask(rules.name, charges.leaving_quotas(counted, usage), enforced=False))
    tx.apply_charges(charges.summed(charges.decide(asks)), now)


def locked(tx: LedgerTx, reservation_id: str) -> tuple[StoredReservation, datetime]:
    """Lock a reservation's row (step 2 of the lock order) and read the database clock."""
    found = tx.lock_reservation(reservation_id)
    if found is None:
        raise ReservationNotFound(reservation_id)
    return found


# -- commit ------------------------------------------------------------------------------------
def by_function_or_general(
    driver: DbQuotaDriver, rules: CompiledRules, reservation_id: str, operation_id: str
) -> tuple[Reservation, bool]:
    """Commit a pending reservation whole by the server function, or by the general path where
    the function declines (:mod:`.paths` chooses this for PostgreSQL); an outcome of
    :func:`commit_general`."""
    done = commit_by_function(driver, reservation_id, operation_id)
    if done is not None:
        return done, False
    return driver.run(lambda tx: commit_general(tx, rules, reservation_id, None, operation_id))


def raise_expired(outcome: tuple[Reservation, bool]) -> Reservation:
    """The committed reservation of :func:`commit_general`'s outcome, once its transaction has
    committed; a reservation it expired instead raises :class:`ReservationStateError`."""
    result, expired = outcome
    if expired:
        raise ReservationStateError(result.id, result.state, "commit")
    return result


def commit_general(
    tx: LedgerTx,
    rules: CompiledRules,
    reservation_id: str,
    amounts: Mapping[str, int] | None,
    operation_id: str,
) -> tuple[Reservation, bool]:
    """The general path's transaction; True with a reservation that had run out of time and
    is expired instead (committed, so that a commit arriving late still cleans up)."""
    stored, now = locked(tx, reservation_id)
    current = stored.reservation
    if current.state is ReservationState.COMMITTED:
        return current, False
    if current.state is not ReservationState.PENDING:
        raise ReservationStateError(current.id, current.state, "commit")
    if now.replace(tzinfo=UTC) >= current.expires_at:
        in_force = rules.partition(tx, current.partition)
        return resolve(tx, stored, ReservationState.EXPIRED, {}, now, "", in_force), True
    committed = arguments.commit_amounts(current, amounts)
    return resolve(tx, stored, ReservationState.COMMITTED, committed, now, operation_id), False


def commit_by_function(driver: DbQuotaDriver, reservation_id: str, operation_id: str) -> Reservation | None:
    """Commit a pending reservation whole in one call of ``ledger_commit_many`` for it alone;
    None when the function declined."""
    call = pg_functions.commit_many([pg_functions.commit_params(reservation_id, operation_id)])
    rows = driver.call(call.sql, call.params)
    return committed(reservation_id, rows[0]) if rows else None


def by_function_in(
    tx: LedgerTx, reservation_id: str, operation_id: str
) -> ByFunction[tuple[Reservation, bool]] | None:
    """How ``ledger_commit_many`` may commit a reservation whole with the batch's other whole
    commits, with an outcome of :func:`commit_general` (what it declines, the general path
    decides); None off PostgreSQL."""
    if tx.pg is None:
        return None

    def finish(rows: list[Any]) -> tuple[Reservation, bool] | None:
        return (committed(reservation_id, rows[0]), False) if rows else None

    params = pg_functions.commit_params(reservation_id, operation_id)
    return ByFunction(("commit",), params, pg_functions.commit_many, finish)


def committed(reservation_id: str, row: Any) -> Reservation:
    """The reservation a commit function returned as ``row``."""
    resources = dict(zip(row.resources, row.amounts, strict=True))
    return Reservation(
        id=reservation_id,
        state=ReservationState.COMMITTED,
        partition=row.partition,
        queue=row.queue,
        resources=resources,
        created_at=row.created_at.replace(tzinfo=UTC),
        expires_at=row.expires_at.replace(tzinfo=UTC),
        key=row.key,
        user=row.user_name,
        groups=tuple(json.loads(row.groups)) if row.groups else (),
        application=row.application,
        priority_class=row.priority_class,
        committed=dict(resources),
        resolved_at=row.resolved_at.replace(tzinfo=UTC),
    )


# -- rollback ----------------------------------------------------------------------------------
def rollback(tx: LedgerTx, rules: CompiledRules, reservation_id: str) -> Reservation:
    """Release a pending reservation; a rolled-back or expired one is returned as it is."""
    stored, now = locked(tx, reservation_id)
    current = stored.reservation
    if current.state is ReservationState.COMMITTED:
        raise ReservationStateError(current.id, current.state, "roll back")
    if current.state is not ReservationState.PENDING:
        return current
    in_force = rules.partition(tx, current.partition)
    return resolve(tx, stored, ReservationState.ROLLED_BACK, {}, now, "", in_force)
