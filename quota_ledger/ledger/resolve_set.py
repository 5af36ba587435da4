"""Commit as a set: a batch's whole commits of plain reservations decided together.

On MariaDB and SQLite group commit would run each commit's general path (:func:`.resolve.
commit_general`) in a savepoint of its own, statement after statement. The whole commits of a
batch are decided here instead with a few statements for all of them, leaving exactly the rows
the general path leaves committing them one after another: the reservation rows are locked in
id order (with their items, and the database clock), each pending one in time, untracked (no
user or application row to move) and with items is committed, the first time its id appears;
their states, items and journal rows are written with one statement each, and each counter
(the queues' own, then the subtree counters of their lineages, each partition in key order) is
locked and updated once with the sum.

Left to each one's own step, which says what it is: an unknown id, a repeat of an id, one
that is not pending (a committed one is returned as it is, another raises), one past its
expiry (expired on the spot), a tracked one, one that would push a counter past the bigint
range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from quota_ledger.driver.journal import journal_rows
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import applications
from quota_ledger.ledger.batch_decision import Together
from quota_ledger.ledger.resolve import by_key, counters_of
from quota_ledger.model import limits as limit_rules
from quota_ledger.model import queues
from quota_ledger.model.errors import CounterOverflow, ReservationStateError
from quota_ledger.model.limits import Counter
from quota_ledger.model.values import Reservation, ReservationState

#: what :func:`.resolve.commit_general` returns: the reservation, and whether it expired instead
Outcome = tuple[Reservation, bool]


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
        if rid in chosen or reservation is None or not _plain_pending(reservation, now):
            continue
        chosen[rid] = n
    if not chosen:
        return {}
    mine = [found[rid] for rid in chosen]
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
    deltas: dict[int, tuple[int, int]] = {}  # counter id -> (d_in_use, d_reserved) so far
    outcomes: dict[int, Outcome] = {}
    journal: list[dict[str, Any]] = []
    for reservation in mine:
        counters = counters_of(reservation, own[reservation.partition], limits[reservation.partition])
        try:
            limit_rules.check_overflow(reservation.resources, _after(counters, deltas), field="in_use")
        except CounterOverflow:
            continue  # its step raises it
        for counter in counters:
            d_in_use, d_reserved = deltas.get(counter.id, (0, 0))
            amount = reservation.resources[counter.resource]
            deltas[counter.id] = (d_in_use + amount, d_reserved - amount)
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
    if tx.commit_reservations(ids, now) != len(ids):
        raise ReservationStateError(ids[0], ReservationState.PENDING, "commit")  # undone: steps decide
    tx.append_journal_rows(journal)
    tx.apply_counter_deltas(deltas, now)
    return outcomes


def _pairs(reservations: Sequence[Reservation], partition: str) -> set[tuple[str, str]]:
    return {(r.queue, res) for r in reservations if r.partition == partition for res in r.resources}


def _plain_pending(reservation: Reservation, now: datetime) -> bool:
    return (
        reservation.state is ReservationState.PENDING
        and now.replace(tzinfo=UTC) < reservation.expires_at
        and not applications.tracked(reservation.user, reservation.application)
        and bool(reservation.resources)
    )


def _after(counters: list[Counter], deltas: Mapping[int, tuple[int, int]]) -> list[Counter]:
    """The counters as they stand after the commits decided so far."""
    return [
        replace(c, in_use=c.in_use + deltas[c.id][0], reserved=c.reserved + deltas[c.id][1])
        if c.id in deltas
        else c
        for c in counters
    ]
