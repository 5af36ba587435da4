"""Reserve as a set: a batch's plain reservations of one partition decided together.

On MariaDB and SQLite group commit would run each reservation's general path (:func:`.reserve.
general`) in a savepoint of its own, a dozen statements each one after another while the
batch holds the counters. A *plain* reservation (no user or application to track, no
idempotency key) of a queue whose counters exist needs none of what makes that path long, so
the plain ones of a batch are decided here with a few statements for all of them, as the
general path would decide them one after another in batch order: under the shared partition
lock and the rules in force, the queues' own counters and the subtree counters of their
lineages are locked once (canonical order: own counters, then subtree, each in key order), the
longest prefix whose running totals fit every limit (and the bigint range) is admitted, its
reservations and items are inserted with one multi-row insert each, and every counter is
updated once with the sum. Their ids are new, so inserting them after the decision cannot meet
another row.

Left to each one's own step (which admits it, or raises the refusal, as it would alone): a
request the ResourceQuota admission rules refuse or that a ResourceQuota counts, one whose
queue has no counter yet for one of its resources (a first use, perhaps of a resource new to
the partition: the general path creates it under its bounds), the first one that does not fit
and every one after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import applications, resource_quotas
from quota_ledger.ledger.batch_decision import Together
from quota_ledger.ledger.reserve import Request
from quota_ledger.ledger.resolve import by_key, counters_of
from quota_ledger.ledger.rules import CompiledRules
from quota_ledger.model import limits as limit_rules
from quota_ledger.model import queues
from quota_ledger.model.errors import CounterOverflow, QuotaLedgerError
from quota_ledger.model.values import Reservation


def plain(request: Request) -> bool:
    """Whether ``request`` may be reserved with others: keyless, untracked, naming resources."""
    return (
        request.key is None
        and not applications.tracked(request.user, request.application)
        and bool(request.resources)
    )


def together(rules: CompiledRules, request: Request) -> Together[Reservation] | None:
    """How group commit decides ``request`` with the other plain ones of its partition (None:
    it is not plain)."""
    if not plain(request):
        return None
    return Together(("reserve", request.partition), request, partial(decide, rules=rules))


def decide(tx: LedgerTx, requests: Sequence[Request], *, rules: CompiledRules) -> dict[int, Reservation]:
    """Reserve what can be reserved of ``requests`` (plain, of one partition) as their general
    paths would one after another; each reservation made, by its request's place."""
    if tx.attempt:
        # A first attempt may have committed: each step finds its own reservation.
        return {}
    partition = requests[0].partition
    now = tx.lock_partition(partition, exclusive=False)
    in_force = rules.partition(tx, partition)
    candidates: list[tuple[int, Request]] = []
    for n, request in enumerate(requests):
        try:
            quotas = resource_quotas.admit(
                in_force, request.queue, request.namespace, request.kube, request.missing
            )
        except QuotaLedgerError:
            continue  # its step raises the refusal
        if not quotas:
            candidates.append((n, request))
    pairs = {(r.queue, resource) for _, r in candidates for resource in r.resources}
    own = tx.lock_queue_counters(partition, pairs)
    candidates = [(n, r) for n, r in candidates if all((r.queue, res) in own for res in r.resources)]
    if not candidates:
        return {}
    scopes = {scope for _, r in candidates for scope in queues.lineage(r.queue)}
    resources = {resource for _, r in candidates for resource in r.resources}
    limits = by_key(tx.lock_subtree_counters(partition, scopes, resources))
    added: dict[int, int] = {}  # counter id -> reserved by the requests admitted so far
    admitted: dict[int, Reservation] = {}
    new: list[tuple[Reservation, str, Mapping[str, Any] | None]] = []
    for n, request in candidates:
        reservation = request.pending(now)
        # its queue's own counters and the limits on its lineage, after the requests before it
        counters = [
            replace(c, reserved=c.reserved + added[c.id]) if c.id in added else c
            for c in counters_of(reservation, own, limits)
        ]
        if limit_rules.violations(partition, request.resources, counters):
            break
        try:
            limit_rules.check_overflow(request.resources, counters)
        except CounterOverflow:
            break
        for counter in counters:
            added[counter.id] = added.get(counter.id, 0) + request.resources[counter.resource]
        admitted[n] = reservation
        new.append((reservation, request.request_hash, request.kube))
    tx.insert_reservations(new)
    tx.apply_counter_deltas({cid: (0, amount) for cid, amount in added.items()}, now)
    return admitted
