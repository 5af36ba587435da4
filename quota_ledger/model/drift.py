"""Recompute what every counter must hold from the ledger's history: pure arithmetic.

``in_use`` of a queue counter is the sum of the journal (commits minus releases) for that
queue and resource; ``reserved`` is the sum of its pending reservation items. A subtree
counter holds the sums over its queue and every queue below it.

The journal itself is checked against the reservations it names (:func:`journal_drift`):
counters recomputed from a journal that lost a release would agree with counters that lost it
too, so that check is what sees such a loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from quota_ledger.model.counters import QUEUE, Counter
from quota_ledger.model.queues import lineage
from quota_ledger.model.values import Drift

Sums = Mapping[tuple[str, str], int]
#: the journal's entries of one kind for one reservation, (reservation id, kind, resource):
#: their total amount, released amounts counted positive
ReservationSums = Mapping[tuple[str, str, str], int]
COMMIT = "commit"
RELEASE = "release"


@dataclass(frozen=True, kw_only=True, slots=True)
class Settled:
    """A committed reservation as its own rows tell it: what the journal must hold for it."""

    reservation_id: str
    queue: str
    #: its committed amounts, zeros left out
    committed: Mapping[str, int]
    released: bool


def subtree_totals(sums: Sums) -> dict[tuple[str, str], int]:
    """Per (queue, resource), the sum over that queue and every queue below it.

    Each sum is added to its queue's lineage once, so this is linear in the history's size
    times the tree depth, not in the number of limits times the history.
    """
    totals: dict[tuple[str, str], int] = {}
    for (queue, resource), value in sums.items():
        for scope in lineage(queue):
            totals[(scope, resource)] = totals.get((scope, resource), 0) + value
    return totals


def expected_values(
    counter: Counter,
    in_use: Sums,
    reserved: Sums,
    *,
    totals: tuple[Sums, Sums] | None = None,
) -> tuple[int, int]:
    """``(in_use, reserved)`` that ``counter`` must hold according to the history.

    ``totals`` are :func:`subtree_totals` of both sums, computed once when checking many.
    """
    key = (counter.scope, counter.resource)
    if counter.scope_type == QUEUE:
        return in_use.get(key, 0), reserved.get(key, 0)
    tree_in_use, tree_reserved = totals or (subtree_totals(in_use), subtree_totals(reserved))
    return tree_in_use.get(key, 0), tree_reserved.get(key, 0)


def find_drift(partition: str, counters: Iterable[Counter], in_use: Sums, reserved: Sums) -> list[Drift]:
    """Every counter whose stored values differ from the history."""
    totals = (subtree_totals(in_use), subtree_totals(reserved))
    drifts = []
    for counter in counters:
        want_in_use, want_reserved = expected_values(counter, in_use, reserved, totals=totals)
        if (counter.in_use, counter.reserved) != (want_in_use, want_reserved):
            drifts.append(
                Drift(
                    partition=partition,
                    scope_type=counter.scope_type,
                    scope=counter.scope,
                    resource=counter.resource,
                    in_use=counter.in_use,
                    reserved=counter.reserved,
                    expected_in_use=want_in_use,
                    expected_reserved=want_reserved,
                )
            )
    return drifts


def missing_queue_counters(
    counters: Iterable[Counter], in_use: Sums, reserved: Sums
) -> list[tuple[str, str]]:
    """(queue, resource) pairs the history has usage for but no queue counter exists."""
    have = {(c.scope, c.resource) for c in counters if c.scope_type == QUEUE}
    needed = {k for k, v in in_use.items() if v} | {k for k, v in reserved.items() if v}
    return sorted(needed - have)


def journal_drift(
    partition: str, settled: Iterable[Settled], entries: ReservationSums, queues: Mapping[str, str]
) -> list[Drift]:
    """Every way the journal disagrees with the reservations it names.

    A committed reservation's commit entries equal its committed amounts, a released one's
    release entries equal them too, and any other reservation has neither. ``settled`` are the
    committed reservations, ``entries`` the journal's totals per reservation, kind and resource,
    ``queues`` the queue of each reservation the journal names. A drift's ``scope_type`` is
    the kind (``commit`` or ``release``), its ``name`` the reservation, its ``scope`` the
    queue, ``in_use`` what the journal holds and ``expected_in_use`` what it should.
    """
    expected: dict[tuple[str, str, str], int] = {}
    queue_of = dict(queues)
    for each in settled:
        queue_of[each.reservation_id] = each.queue
        for resource, amount in each.committed.items():
            expected[(each.reservation_id, COMMIT, resource)] = amount
            if each.released:
                expected[(each.reservation_id, RELEASE, resource)] = amount
    drifts = []
    for key in sorted(expected.keys() | entries.keys()):
        held, wanted = entries.get(key, 0), expected.get(key, 0)
        if held != wanted:
            reservation_id, kind, resource = key
            drifts.append(
                Drift(
                    partition=partition,
                    scope_type=kind,
                    scope=queue_of.get(reservation_id, ""),
                    resource=resource,
                    in_use=held,
                    reserved=0,
                    expected_in_use=wanted,
                    expected_reserved=0,
                    name=reservation_id,
                )
            )
    return drifts
