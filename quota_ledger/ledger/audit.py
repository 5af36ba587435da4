"""The audit's transactions: read every counter and what the history says it must hold.

Queue and subtree resource counters are checked against the journal and the pending items
(:mod:`quota_ledger.model.drift`); running-application counts and user/group counters against the
application rows (:mod:`quota_ledger.config.identity`); the journal against the reservations it
names; waiting rows against what a waiting request is (they hold nothing: a pending item sum
that counted one would show as drift of the counters).

A repair trusts the reservations: they are what callers were answered. A journal that lacks a
commit or a release a reservation says was made gets it appended before the counters are
recomputed; a journal that holds more than its reservations say cannot be mended by appending
(its entries only grow), so the counters it feeds are reported and left as they are.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any

from quota_ledger.config import identity
from quota_ledger.config.rules import PartitionRules
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import resource_quotas
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.model import drift, queues
from quota_ledger.model.counters import QUEUE, QUOTA, SUBTREE, Counter
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Drift

RulesOf = Callable[[LedgerTx], PartitionRules]


def audit(driver: DbQuotaDriver, rules: CompiledRules, partitions: Sequence[str], fix: bool) -> list[Drift]:
    """Every partition's drift, one transaction each: read in one snapshot, or repaired under
    the partition's exclusive lock (then the drifts come back with ``fixed=True``)."""
    drifts: list[Drift] = []
    for name in partitions:
        if fix:
            drifts += driver.run(partial(fix_partition, partition=name, rules_of=rules.of(name)))
        else:
            read = partial(read_drift, partition=name, rules_of=rules.of(name))
            drifts += driver.run(read, isolation="REPEATABLE READ")
    return drifts


def read_drift(tx: LedgerTx, partition: str, rules_of: RulesOf) -> list[Drift]:
    rules = rules_of(tx)
    quotas = tx.identity_counters(partition, lock=False, kinds=[QUOTA])
    live = tx.live_reservations(partition, resource_quotas.queues_to_lock(rules, quotas), lock=False)
    drifts = find(
        tx,
        partition,
        tx.all_counters(partition),
        tx.identity_counters(partition, lock=False),
        tx.read_apps(partition),
    )
    waits = _waiting_drift(tx, partition)
    return _journal_drift(tx, partition) + drifts + _quota_drift(partition, rules, quotas, live) + waits


def fix_partition(tx: LedgerTx, partition: str, rules_of: RulesOf) -> list[Drift]:
    """Repair a partition under its exclusive lock (canonical order: live reservations, apps,
    then counters)."""
    now = tx.lock_partition(partition, exclusive=True)
    rules = rules_of(tx)
    old_quotas = tx.identity_counters(partition, lock=False, kinds=[QUOTA])
    live = tx.live_reservations(partition, resource_quotas.queues_to_lock(rules, old_quotas), lock=True)
    apps = tx.lock_all_apps(partition)
    own = tx.lock_all_counters(partition, QUEUE)
    limits = tx.lock_all_counters(partition, SUBTREE)
    named = tx.identity_counters(partition, lock=True)
    journal = _journal_drift(tx, partition)
    mended = _mend_journal(tx, partition, journal, now)
    kept = _kept_counters([d for d in journal if d not in mended])
    in_use, reserved = tx.journal_sums(partition), tx.pending_sums(partition)
    missing = drift.missing_queue_counters(own, in_use, reserved)
    if missing:
        tx.create_missing(partition, missing, now)
        own = tx.lock_all_counters(partition, QUEUE)
    drifts = find(tx, partition, [*own, *limits], named, apps, sums=(in_use, reserved))
    by_key = {_key(d): d for d in drifts}
    for key in kept:
        by_key.pop(key, None)

    def wanted(c: Counter) -> Drift | None:
        return by_key.get((c.scope_type, c.name, c.scope, c.resource))

    tx.set_counter_values(
        {c.id: (d.expected_in_use, d.expected_reserved) for c in [*own, *limits] if (d := wanted(c))},
        now,
    )
    tx.set_identity_counters(
        {c.id: (d.expected_in_use, d.expected_reserved, c.limit or 0) for c in named if (d := wanted(c))},
        now,
    )
    quotas = tx.identity_counters(partition, lock=True, kinds=[QUOTA])
    quota_drifts = _quota_drift(partition, rules, quotas, live)
    by_quota = {(d.name, d.scope, d.resource): d for d in quota_drifts}
    tx.set_identity_counters(
        {
            c.id: (d.expected_in_use, d.expected_reserved, c.limit or 0)
            for c in quotas
            if (d := by_quota.get((c.name, c.scope, c.resource))) is not None
        },
        now,
    )
    journal_result = [replace(d, fixed=d in mended) for d in journal]
    counter_result = [replace(d, fixed=_key(d) not in kept) for d in drifts]
    waits = _waiting_drift(tx, partition)
    tx.leave_line([d.name for d in waits if d.name is not None], "rolled_back", now)
    fixed = [replace(d, fixed=True) for d in [*quota_drifts, *waits]]
    return journal_result + counter_result + fixed


def _waiting_drift(tx: LedgerTx, partition: str) -> list[Drift]:
    """A waiting row that no waiting request can be (``scope_type`` ``waiting``, ``name`` its
    id): it holds nothing, and a repair takes it out of line as ``rolled_back``."""
    return [
        Drift(
            partition=partition,
            scope_type="waiting",
            scope=queue,
            resource="",
            in_use=0,
            reserved=0,
            expected_in_use=0,
            expected_reserved=0,
            name=rid,
        )
        for rid, queue in tx.malformed_waits(partition)
    ]


def _key(d: Drift) -> tuple[str, str | None, str, str]:
    return d.scope_type, d.name, d.scope, d.resource


def _journal_drift(tx: LedgerTx, partition: str) -> list[Drift]:
    entries, named = tx.reservation_journal(partition)
    return drift.journal_drift(partition, tx.committed_reservations(partition), entries, named)


def _mend_journal(tx: LedgerTx, partition: str, journal: Sequence[Drift], now: datetime) -> list[Drift]:
    """Append what the journal lacks of what its reservations say; the drifts so mended."""
    mended = [d for d in journal if d.in_use < d.expected_in_use]
    for d in mended:
        missing = d.expected_in_use - d.in_use
        tx.append_journal(
            partition,
            d.scope,
            {d.resource: missing if d.scope_type == drift.COMMIT else -missing},
            kind=d.scope_type,
            operation_id=str(uuid.uuid4()),
            reservation_id=d.name,
            now=now,
        )
    return mended


def _kept_counters(unmended: Iterable[Drift]) -> set[tuple[str, str | None, str, str]]:
    """The counters (as drift keys) a journal holding too much feeds: not repaired towards it."""
    kept: set[tuple[str, str | None, str, str]] = set()
    for d in unmended:
        kept.add((QUEUE, None, d.scope, d.resource))
        kept.update((SUBTREE, None, scope, d.resource) for scope in queues.lineage(d.scope))
    return kept


def _quota_drift(
    partition: str,
    rules: PartitionRules,
    counters: Iterable[Counter],
    live: Iterable[tuple[str, str, dict[str, Any] | None]],
) -> list[Drift]:
    """ResourceQuota counters against the live reservations their quotas match."""
    wanted = resource_quotas.desired(rules, live)
    drifts = []
    for counter in counters:
        used, _ = wanted.get((counter.name or "", counter.scope, counter.resource), (0, 0))
        drifts += _differs(partition, counter, (used, 0))
    return drifts


def find(
    tx: LedgerTx,
    partition: str,
    counters: Iterable[Counter],
    named: Iterable[Counter],
    apps: Iterable[AppState],
    *,
    sums: tuple[drift.Sums, drift.Sums] | None = None,
) -> list[Drift]:
    in_use, reserved = sums or (tx.journal_sums(partition), tx.pending_sums(partition))
    counter_list = list(counters)
    app_list = list(apps)
    plain = [c for c in counter_list if c.resource != APPLICATIONS]
    drifts = drift.find_drift(partition, plain, in_use, reserved)
    counts = identity.queue_app_counts(app_list)
    for counter in counter_list:
        if counter.resource == APPLICATIONS:
            drifts += _differs(partition, counter, (identity.subtree_count(counts, counter.scope), 0))
    for counter in named:
        key = (counter.scope_type, counter.name or "", counter.scope, counter.resource)
        drifts += _differs(partition, counter, identity.value(app_list, key))
    return drifts


def _differs(partition: str, counter: Counter, expected: tuple[int, int]) -> list[Drift]:
    if (counter.in_use, counter.reserved) == expected:
        return []
    return [
        Drift(
            partition=partition,
            scope_type=counter.scope_type,
            scope=counter.scope,
            resource=counter.resource,
            in_use=counter.in_use,
            reserved=counter.reserved,
            expected_in_use=expected[0],
            expected_reserved=expected[1],
            name=counter.name,
        )
    ]
