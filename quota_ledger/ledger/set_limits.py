"""Setting one queue's max (``set_limits``) as a change of that queue alone.

The writer locks the config head (writers queue there), checks the change against what it
touches (:mod:`quota_ledger.config.local_check`), then locks only the partition it changes,
exclusively, and updates, inserts or deletes only that queue's subtree counters. The version is
recorded as change rows, not as a copy of the whole configuration. A reservation sees either
the old limits or the new ones: it reads the version in force and the counters under its
shared partition lock. A queue that is not configured yet is added the same way, with the
levels missing above it (replaying its change rows adds them, as the whole-configuration path
would), when :func:`~quota_ledger.config.local_check.new_queue` finds it certainly valid; any
other (a new partition, placement rules in its partition, a change the whole check may refuse)
takes the whole-configuration path of :func:`~quota_ledger.ledger.configure.apply`, which
reports every problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from quota_ledger.config import local_check, typos
from quota_ledger.config.local_check import ConfigIndex
from quota_ledger.config.queue_max import ROOT
from quota_ledger.config.rules import Rules, with_queue_max
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import configure
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.model import queues, validation
from quota_ledger.model.errors import ConfigError, ManagedQueue
from quota_ledger.model.values import LimitsVersion


def set_limits(
    tx: LedgerTx,
    rules: CompiledRules,
    partition: str,
    queue: str,
    limits: Mapping[str, int | None],
    bounds: validation.Bounds,
) -> LimitsVersion:
    """Set (None: remove) ``limits`` on ``queue``'s max; returns the version in force after,
    with a warning for each name that looks like a typo of a known one (refused instead, with
    nothing changed, where the partition refuses unknown names).

    Nothing changes, and no version is made, when every limit already has that value.
    """
    version = tx.lock_config_head()
    compiled, index = rules.indexed(tx, version)
    if (owned := local_check.manager(index, partition, queue)) is not None:
        raise ManagedQueue(queue, *owned)
    before = compiled.partition(partition)
    unknown = typos.in_limits(before, queue, limits)
    if before.refuses_unknown_names and (refused := unknown.refusal()) is not None:
        raise refused
    made = _set(tx, rules, (compiled, index), partition, queue, limits, bounds)
    return LimitsVersion(made, unknown.warnings())


def _set(
    tx: LedgerTx,
    rules: CompiledRules,
    in_force: tuple[Rules, ConfigIndex],
    partition: str,
    queue: str,
    limits: Mapping[str, int | None],
    bounds: validation.Bounds,
) -> int:
    compiled, index = in_force
    version = compiled.version
    if queue == ROOT:
        capacity = compiled.partition(partition).capacity
        changes = {r: v for r, v in limits.items() if capacity.get(r) != v}
    elif local_check.configured(index, partition, queue):
        checked = local_check.check_max(index, partition, queue, limits, bounds)
        if checked.problems:
            raise ConfigError(list(checked.problems))
        changes = dict(checked.changes)
    elif (added := local_check.new_queue(index, partition, queue, limits, bounds)) is not None:
        changes = dict(added.limits)
    else:
        edit = configure.set_queue_max(partition, queue, limits)
        return configure.apply(tx, edit, compiled=rules.remember, bounds=bounds)
    if not changes:
        return version
    now = tx.lock_partition(partition, exclusive=True)
    if queue == ROOT:
        tx.ensure_partition(partition, now)  # a configured queue's partition has its row already
    before = compiled.partition(partition)
    rule = before.queues.get(queue)
    limited = before.capacity if queue == ROOT else (rule.max if rule is not None else {})
    _set_counters(tx, partition, queue, changes, set(limited), now)
    tx.store_changes(version + 1, partition, queue, changes, now)
    new_rules = with_queue_max(compiled, version + 1, partition, queue, changes)
    new_index = local_check.advanced(index, version + 1, partition, queue, changes)
    tx.after_commit.append(lambda: rules.remember(new_rules, new_index))
    return version + 1


def _set_counters(
    tx: LedgerTx,
    partition: str,
    queue: str,
    changes: Mapping[str, int | None],
    limited: set[str],
    now: datetime,
) -> None:
    """Bring ``queue``'s subtree counters of the changed resources in line; a new one starts
    from the queue counters below it, as :func:`configure.reconcile` does. ``limited`` are the
    resources the queue had limits on, so had counters for. Caller holds the exclusive
    partition lock: no other writer creates or removes these counters, and no reservation
    moves the counters below."""
    new = [r for r, v in changes.items() if v is not None and r not in limited]
    below = tx.lock_queue_counters_below(partition, queue, new)  # step 5
    locked = {c.resource: c for c in tx.lock_limits_at(partition, queue, changes)}  # step 6
    for resource, limit in sorted(changes.items()):
        counter = locked.get(resource)
        if limit is None:
            if counter is not None:
                tx.delete_counter(counter.id)
        elif counter is not None:
            if counter.limit != limit:
                tx.set_limit(counter.id, limit, now)
        else:
            if resource not in new:  # its counter went missing: count what is below now
                below += tx.lock_queue_counters_below(partition, queue, [resource])
            mine = [c for c in below if c.resource == resource and queues.in_subtree(c.scope, queue)]
            tx.insert_subtree_counter(
                partition,
                queue,
                resource,
                in_use=sum(c.in_use for c in mine),
                reserved=sum(c.reserved for c in mine),
                limit=limit,
                now=now,
            )
