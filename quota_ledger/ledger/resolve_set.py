"""Commit as a set: a batch's whole commits decided together.

On MariaDB and SQLite group commit would run each commit's general path (:func:`.resolve.
commit_general`) in a savepoint of its own, statement after statement. The whole commits of a
batch are decided here instead with a few statements for all of them, leaving exactly the rows
the general path leaves committing them one after another, in batch order, at the instant the
set reads from the database clock: the reservation rows are locked in id order (with their
items, and the clock), and each pending one in time with items is committed, the first time
its id appears. The tracked ones (a user or an application) have their application rows locked
with one statement a partition, each moved in memory as its reservations' steps would move it
(its in-use area integrated up to now, then each reservation's usage moved from reserved to in
use: a commit never stops an application) and written once. The states, items and journal rows
are written with one statement each, and each counter (the queues' own, then the subtree
counters of their lineages, then the user and group counters the application rows name, each
partition in key order) is locked and updated once with the sum.

Left to each one's own step, which says what it is: an unknown id, a repeat of an id, one
that is not pending (a committed one is returned as it is, another raises), one past its
expiry (expired on the spot), a tracked one without its application row, one that would push
a counter past the bigint range (checked against the counters as the set's earlier commits
leave them, before its application row is moved).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from quota_ledger.driver.journal import journal_rows
from quota_ledger.driver.tx import LedgerTx, Undo
from quota_ledger.ledger import applications
from quota_ledger.ledger.group_decision import Together
from quota_ledger.ledger.resolve import by_key, counters_of
from quota_ledger.model import charges, queues, tracking
from quota_ledger.model.counters import Counter
from quota_ledger.model.errors import ReservationStateError
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Reservation, ReservationState

#: what :func:`.resolve.commit_general` returns: the reservation, and whether it expired instead
Outcome = tuple[Reservation, bool]
#: an application row by (partition, app_key)
AppKey = tuple[str, str]


def together(reservation_id: str, operation_id: str) -> Together[Outcome]:
    """How group commit decides a whole commit with the others of its batch."""
    return Together(("commit",), (reservation_id, operation_id), decide)


def decide(tx: LedgerTx, commits: Sequence[tuple[str, str]]) -> dict[int, Outcome]:
    """Commit whole what can be committed of ``commits`` (reservation id, operation id) as
    their general paths would one after another; each outcome, by its commit's place."""
    stored, now = tx.lock_reservations(rid for rid, _ in commits)
    if now is None:
        return {}
    found = {each.reservation.id: each.reservation for each in stored}
    chosen: dict[str, int] = {}
    for n, (rid, _) in enumerate(commits):
        reservation = found.get(rid)
        if rid in chosen or reservation is None or not _pending(reservation, now):
            continue
        chosen[rid] = n
    apps = _lock_apps(tx, [found[rid] for rid in chosen])
    mine = [r for rid in chosen if not _tracked(r := found[rid]) or _app_key(r) in apps]
    if not mine:
        return {}
    partitions = sorted({r.partition for r in mine})
    own = {p: tx.lock_queue_counters(p, _pairs(mine, p)) for p in partitions}
    limits = {
        p: by_key(
            tx.lock_subtree_counters(
                p,
                {scope for r in mine if r.partition == p for scope in queues.lineage(r.queue)},
                {res for r in mine if r.partition == p for res in r.resources},
            )
        )
        for p in partitions
    }
    identity = {p: _lock_identity(tx, apps, [r for r in mine if r.partition == p]) for p in partitions}
    asks = []
    apps_of: list[AppState | None] = []
    for reservation in mine:
        counters = counters_of(reservation, own[reservation.partition], limits[reservation.partition])
        app = apps.get(_app_key(reservation)) if _tracked(reservation) else None
        scoped = [] if app is None else _charged(app, reservation, identity[reservation.partition])
        moves = charges.resolving([*counters, *scoped], reservation.resources, reservation.resources)
        asks.append(charges.Ask(reservation.partition, moves, enforced=False))
        apps_of.append(app)
    decided = charges.decide(asks)
    moved: dict[AppKey, AppState] = {}
    outcomes: dict[int, Outcome] = {}
    journal: list[dict[str, Any]] = []
    for reservation, app, decision in zip(mine, apps_of, decided, strict=True):
        if not decision.admitted:
            continue  # past the bigint range: its step raises it; its application row is not moved
        if app is not None:
            tracking.resolve(app, reservation.resources, reservation.resources, now)
            moved[_app_key(reservation)] = app
        n = chosen[reservation.id]
        journal += journal_rows(
            reservation.partition,
            reservation.queue,
            reservation.resources,
            kind="commit",
            operation_id=commits[n][1],
            reservation_id=reservation.id,
            now=now,
        )
        committed = replace(
            reservation,
            state=ReservationState.COMMITTED,
            committed=dict(reservation.resources),
            resolved_at=now.replace(tzinfo=UTC),
        )
        outcomes[n] = (committed, False)
    if not outcomes:
        return {}
    ids = [r.id for r, _ in outcomes.values()]
    undo = Undo(tx)
    undo.before_write()
    with undo.on_failure():
        if tx.commit_reservations(ids, now) != len(ids):
            raise ReservationStateError(ids[0], ReservationState.PENDING, "commit")  # undone: steps decide
        with tx.writes_together():
            tx.append_journal_rows(journal)
            tx.update_apps(moved[key] for key in sorted(moved))
            tx.apply_charges(charges.summed(decided), now)
    undo.release()
    return outcomes


def _pending(reservation: Reservation, now: datetime) -> bool:
    return (
        reservation.state is ReservationState.PENDING
        and now.replace(tzinfo=UTC) < reservation.expires_at
        and bool(reservation.resources)
    )


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


def _lock_identity(
    tx: LedgerTx, apps: Mapping[AppKey, AppState], reservations: Sequence[Reservation]
) -> list[Counter]:
    """Lock the user/group counters that charge the applications of the tracked ones among
    ``reservations`` (of one partition), for their resources, with one statement."""
    tracked = [r for r in reservations if _tracked(r)]
    mine = {key: apps[key] for r in tracked if (key := _app_key(r)) in apps}
    resources = {res for r in tracked for res in r.resources}
    return applications.lock_of(tx, [mine[key] for key in sorted(mine)], resources)


def _charged(app: AppState, reservation: Reservation, counters: Iterable[Counter]) -> list[Counter]:
    """The user/group counters a tracked reservation's commit moves: its application's, for
    the reservation's resources (the lock took those of the whole set)."""
    return [c for c in applications.charges(app, counters) if c.resource in reservation.resources]


def _pairs(reservations: Sequence[Reservation], partition: str) -> set[tuple[str, str]]:
    return {(r.queue, res) for r in reservations if r.partition == partition for res in r.resources}
