"""Resolving pending reservations: commit (whole or in part), rollback, the release of a pending
one and expiry, by one function for a set of them (:func:`resolve`), a single call being a set
of one.

:func:`resolve` takes pending reservations this transaction holds (step 3 of the lock order in
:mod:`quota_ledger.driver.tx`), each with what it becomes, and resolves them as their steps
would one after another, in order, at the instant the caller read from the database clock:

- the application rows of the tracked ones (a user or an application) are locked, one
  statement a partition in key order, and moved in memory reservation after reservation (the
  in-use area integrated up to now, what it reserved given back, what it commits in use); an
  application that a rollback or an expiry leaves idle stops running;
- the queues' own counters are locked, then the subtree counters of their lineages (with
  ``applications`` where an application stops), then the user and group counters of the
  applications, each partition in key order;
- the rule (:mod:`quota_ledger.model.charges`) gives each reservation's charges, each seeing
  what those before it added. One that would push a counter past the bigint range is not
  resolved and its outcome is the error (a set of one raises it); the others are decided again
  without it, its application row unmoved;
- the states (and the items a commit commits) are written, then the commits' journal rows, the
  summaries of the applications that stopped, the application rows and every counter, once with
  the sum (on MariaDB as one compound statement); the reservations that were not committed
  leave the ResourceQuotas that count them.

Commit and rollback lock their reservation (:func:`locked`) and resolve it as a set of one
(:func:`commit_general`, :func:`rollback`, and the release of a pending reservation). On
MariaDB and SQLite a batch's commits, whole or partial, are one set (:func:`together`); the
expiry sweep's batches are sets (:mod:`.expire`). On PostgreSQL a whole commit may be decided
first by the server function (:mod:`.commit_function`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

from quota_ledger.config.rules import PartitionRules
from quota_ledger.driver.journal import journal_rows
from quota_ledger.driver.tx import LedgerTx, Undo
from quota_ledger.kube.quotas import ResourceQuota
from quota_ledger.ledger import applications, resource_quotas, waiting
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.ledger.group_decision import Refused, Together
from quota_ledger.model import arguments, charges, queues, tracking
from quota_ledger.model.counters import QUOTA, Counter
from quota_ledger.model.errors import QuotaLedgerError, ReservationNotFound, ReservationStateError
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Reservation, ReservationState, StoredReservation

PENDING = ReservationState.PENDING
COMMITTED = ReservationState.COMMITTED
ROLLED_BACK = ReservationState.ROLLED_BACK
EXPIRED = ReservationState.EXPIRED
#: what a commit returns: the reservation, and whether it was expired instead (its time had run
#: out; committed, so that a commit arriving late still cleans up)
CommitOutcome = tuple[Reservation, bool]
#: an application row by (partition, app_key)
AppKey = tuple[str, str]
#: how an application ends that a reservation going away uncommitted leaves idle
_HOW = {ROLLED_BACK: "RolledBack", EXPIRED: "Expired"}


@dataclass(frozen=True, slots=True)
class Resolution:
    """A pending reservation this transaction holds and what it becomes: ``state``, with what
    each resource commits (a commit; all it reserved for a whole one)."""

    stored: StoredReservation
    state: ReservationState
    committed: Mapping[str, int] = field(default_factory=dict)
    #: a commit's operation, in the journal
    operation_id: str = ""

    @property
    def reservation(self) -> Reservation:
        return self.stored.reservation

    def resolved(self, now: datetime) -> Reservation:
        """The reservation once resolved at ``now``."""
        return replace(
            self.reservation,
            state=self.state,
            committed=dict(self.committed) if self.state is COMMITTED else None,
            resolved_at=now.replace(tzinfo=UTC),
        )


def resolve(
    tx: LedgerTx, rules: CompiledRules, wanted: Sequence[Resolution], now: datetime
) -> list[Reservation | QuotaLedgerError]:
    """Resolve ``wanted`` (distinct reservations) as their steps would one after another; each
    one's outcome, in order: the reservation resolved, or the error of one that was not."""
    quotas = {
        p: rules.partition(tx, p)
        for p in sorted({w.reservation.partition for w in wanted if w.state is not COMMITTED})
    }
    refused: dict[int, QuotaLedgerError] = {}
    places = list(range(len(wanted)))
    while places:
        moved = _decide(tx, [wanted[n] for n in places], now)
        errors = {
            n: e for n, d in zip(places, moved.decisions, strict=True) if (e := d.refusal()) is not None
        }
        if not errors:
            _write(tx, quotas, [wanted[n] for n in places], moved, now)
            break
        refused.update(errors)  # decided again without them: their application rows unmoved
        places = [n for n in places if n not in errors]
    return [refused[n] if n in refused else each.resolved(now) for n, each in enumerate(wanted)]


def resolve_one(tx: LedgerTx, rules: CompiledRules, wanted: Resolution, now: datetime) -> Reservation:
    """:func:`resolve` for a set of one: the reservation resolved; its error is raised."""
    (outcome,) = resolve(tx, rules, [wanted], now)
    if isinstance(outcome, QuotaLedgerError):
        raise outcome
    return outcome


@dataclass(frozen=True, slots=True)
class _Moved:
    """What one pass of :func:`resolve` decided: the application rows moved (locked), the
    summaries of those that stopped, and each reservation's charges."""

    apps: dict[AppKey, AppState]
    summaries: dict[AppKey, dict[str, Any]]
    decisions: list[charges.Decision]


def _decide(tx: LedgerTx, todo: Sequence[Resolution], now: datetime) -> _Moved:
    """Lock what ``todo`` resolves, in the lock order, move its application rows in memory and
    ask the rule for each one's charges."""
    reservations = [each.reservation for each in todo]
    apps = _lock_apps(tx, reservations)
    found = [apps.get(_app_key(r)) if _tracked(r) else None for r in reservations]
    summaries: dict[AppKey, dict[str, Any]] = {}
    stops = []
    for each, app in zip(todo, found, strict=True):
        summary = None if app is None else _move(app, each, now)
        if summary is not None:
            summaries[_app_key(each.reservation)] = summary
        stops.append(summary is not None)
    of = {
        p: [r for r in reservations if r.partition == p] for p in sorted({r.partition for r in reservations})
    }
    stopping = {r.partition for r, stopped in zip(reservations, stops, strict=True) if stopped}
    own = {
        p: tx.lock_queue_counters(p, {(r.queue, res) for r in mine for res in r.resources})
        for p, mine in of.items()
    }
    limits = {
        p: by_key(
            tx.lock_subtree_counters(
                p, {s for r in mine for s in queues.lineage(r.queue)}, _resources(mine, p in stopping)
            )
        )
        for p, mine in of.items()
    }
    charged = [(r, app) for r, app in zip(reservations, found, strict=True) if app is not None]
    scoped = {
        p: _lock_scoped(tx, [(r, a) for r, a in charged if r.partition == p], p in stopping) for p in of
    }
    asks = []
    for each, app, stopped in zip(todo, found, stops, strict=True):
        r = each.reservation
        counted = counters_of(r, own[r.partition], limits[r.partition], applications=stopped)
        if app is not None:
            counted += [
                c
                for c in applications.charges(app, scoped[r.partition])
                if c.resource in r.resources or (stopped and c.resource == APPLICATIONS)
            ]
        moves = charges.resolving(counted, r.resources, each.committed, stopped=stopped)
        asks.append(charges.Ask(r.partition, moves, enforced=False))
    return _Moved(apps, summaries, charges.decide(asks))


def _resources(reservations: Iterable[Reservation], stopping: bool) -> set[str]:
    """The resources of ``reservations``, and ``applications`` when one of them stops its
    application."""
    return {res for r in reservations for res in r.resources} | ({APPLICATIONS} if stopping else set())


def _lock_scoped(
    tx: LedgerTx, charged: Sequence[tuple[Reservation, AppState]], stopping: bool
) -> list[Counter]:
    """Lock the user/group counters of the application rows of ``charged`` (reservations of one
    partition, with their rows), for the reservations' resources."""
    apps = {app.app_key: app for _, app in charged}
    return applications.lock_of(
        tx, [apps[key] for key in sorted(apps)], _resources([r for r, _ in charged], stopping)
    )


def _move(app: AppState, each: Resolution, now: datetime) -> dict[str, Any] | None:
    """Move ``app`` as ``each``'s step would; the summary of a running application that it
    stops (a rollback or an expiry that leaves it idle)."""
    tracking.resolve(app, each.reservation.resources, each.committed, now)
    if each.state is COMMITTED or not tracking.idle(app):
        return None
    return tracking.finish(app, now, _HOW[each.state])


def _write(
    tx: LedgerTx,
    quotas: Mapping[str, PartitionRules],
    done: Sequence[Resolution],
    moved: _Moved,
    now: datetime,
) -> None:
    """Write what :func:`_decide` decided for ``done``."""
    if _write_states(tx, done, now) != len(done):
        first = done[0]
        raise ReservationStateError(first.reservation.id, first.reservation.state, first.state.value)
    journal = [
        row
        for each in done
        if each.state is COMMITTED
        for row in journal_rows(
            each.reservation.partition,
            each.reservation.queue,
            each.committed,
            kind="commit",
            operation_id=each.operation_id,
            reservation_id=each.reservation.id,
            now=now,
        )
    ]
    with tx.writes_together():
        tx.append_journal_rows(journal)
        applications.summarize(tx, [moved.summaries[key] for key in sorted(moved.summaries)], now)
        tx.update_apps(moved.apps[key] for key in sorted(moved.apps))
        tx.apply_charges(charges.summed(moved.decisions), now)
    for p, in_force in quotas.items():
        leaving = [
            each.stored for each in done if each.state is not COMMITTED and each.reservation.partition == p
        ]
        leave_quotas(tx, in_force, leaving, now)


def _write_states(tx: LedgerTx, done: Sequence[Resolution], now: datetime) -> int:
    """Move ``done`` to their states, with what each item commits; how many were pending."""
    whole = [
        e.reservation.id for e in done if e.state is COMMITTED and e.committed == e.reservation.resources
    ]
    expired = [e.reservation.id for e in done if e.state is EXPIRED]
    changed = tx.commit_reservations(whole, now) if whole else 0
    changed += tx.expire_reservations(expired, now) if expired else 0
    for each in done:
        if each.state is EXPIRED or each.reservation.id in whole:
            continue
        changed += tx.resolve_reservation(each.reservation.id, each.state, now)
        if each.state is COMMITTED:
            tx.record_commits(each.reservation.id, each.committed, whole=False)
    return changed


def _tracked(reservation: Reservation) -> bool:
    return applications.tracked(reservation.user, reservation.application)


def _app_key(reservation: Reservation) -> AppKey:
    return reservation.partition, applications.key_of(reservation)


def _lock_apps(tx: LedgerTx, reservations: Sequence[Reservation]) -> dict[AppKey, AppState]:
    """Lock the application rows of the tracked ones among ``reservations``, one statement a
    partition in key order; those found, by (partition, app_key)."""
    keys = sorted({_app_key(r) for r in reservations if _tracked(r)})
    apps: dict[AppKey, AppState] = {}
    for partition in sorted({p for p, _ in keys}):
        found = tx.lock_apps(partition, [key for p, key in keys if p == partition])
        apps.update({(partition, key): app for key, app in found.items()})
    return apps


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


# -- commit and rollback -----------------------------------------------------------------------
def locked(tx: LedgerTx, reservation_id: str) -> tuple[StoredReservation, datetime]:
    """Lock a reservation's row (step 3 of the lock order) and read the database clock."""
    found = tx.lock_reservation(reservation_id)
    if found is None:
        raise ReservationNotFound(reservation_id)
    return found


def committing(
    stored: StoredReservation, amounts: Mapping[str, int] | None, operation_id: str, now: datetime
) -> Resolution:
    """What a commit of a pending reservation makes of it: committed with ``amounts`` (None:
    all it reserved), or expired when its time has run out."""
    if now.replace(tzinfo=UTC) >= stored.reservation.expires_at:
        return Resolution(stored, EXPIRED)
    return Resolution(stored, COMMITTED, arguments.commit_amounts(stored.reservation, amounts), operation_id)


def commit_general(
    tx: LedgerTx,
    rules: CompiledRules,
    reservation_id: str,
    amounts: Mapping[str, int] | None,
    operation_id: str,
) -> CommitOutcome:
    """A commit's step: a committed reservation is returned as it is, one neither pending nor
    committed raises :class:`ReservationStateError`, a pending one is resolved as a set of one."""
    stored, now = locked(tx, reservation_id)
    current = stored.reservation
    if current.state is COMMITTED:
        return current, False
    if current.state is not PENDING:
        raise ReservationStateError(current.id, current.state, "commit")
    wanted = committing(stored, amounts, operation_id, now)
    return resolve_one(tx, rules, wanted, now), wanted.state is EXPIRED


def raise_expired(outcome: CommitOutcome) -> Reservation:
    """The committed reservation of :func:`commit_general`'s outcome, once its transaction has
    committed; a reservation it expired instead raises :class:`ReservationStateError`."""
    result, expired = outcome
    if expired:
        raise ReservationStateError(result.id, result.state, "commit")
    return result


def rollback(tx: LedgerTx, rules: CompiledRules, reservation_id: str) -> Reservation:
    """Release a pending reservation, or take a waiting one out of line; a rolled-back or
    expired one is returned as it is."""
    stored, now = locked(tx, reservation_id)
    current = stored.reservation
    if current.state is COMMITTED:
        raise ReservationStateError(current.id, current.state, "roll back")
    if current.state is ReservationState.WAITING:
        return waiting.cancel(tx, current, now)
    if current.state is not PENDING:
        return current
    return resolve_one(tx, rules, Resolution(stored, ROLLED_BACK), now)


def together(
    rules: CompiledRules, reservation_id: str, amounts: Mapping[str, int] | None, operation_id: str
) -> Together[CommitOutcome]:
    """How group commit decides a commit with the others of its batch (MariaDB, SQLite)."""
    return Together(("commit",), (reservation_id, amounts, operation_id), partial(commit_set, rules=rules))


def commit_set(
    tx: LedgerTx, commits: Sequence[tuple[str, Mapping[str, int] | None, str]], rules: CompiledRules
) -> dict[int, CommitOutcome | Refused]:
    """Commit what can be committed of ``commits`` (reservation id, amounts, operation id) as
    their steps would one after another, the reservations locked in id order with the clock (one
    past its expiry is expired); each outcome, by its commit's place (one that would push a
    counter past the bigint range: its error). Left to each one's step, which says what it is:
    an unknown id, a repeat of an id, one that is not pending, and amounts it cannot commit."""
    stored, now = tx.lock_reservations(rid for rid, _, _ in commits)
    if now is None:
        return {}
    found = {each.reservation.id: each for each in stored}
    seen: set[str] = set()
    places, wanted = [], []
    for n, (rid, amounts, operation_id) in enumerate(commits):
        each = found.get(rid)
        if rid in seen or each is None or each.reservation.state is not PENDING:
            continue
        seen.add(rid)
        try:
            wanted.append(committing(each, amounts, operation_id, now))
        except QuotaLedgerError:
            continue  # its step raises it
        places.append(n)
    if not wanted:
        return {}
    undo = Undo(tx)
    undo.before_write()
    with undo.on_failure():
        outcomes = resolve(tx, rules, wanted, now)
    undo.release()
    return {
        n: Refused(outcome) if isinstance(outcome, QuotaLedgerError) else (outcome, each.state is EXPIRED)
        for n, each, outcome in zip(places, wanted, outcomes, strict=True)
    }
