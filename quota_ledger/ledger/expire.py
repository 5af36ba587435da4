"""Expiry: the sweep that resolves pending reservations whose time ran out.

Partition by partition, in batches of one short transaction each (:mod:`.batches` runs them,
on one or several threads, paced). On PostgreSQL the plain reservations of a partition (those
no ResourceQuota counts) go first, a whole batch per call of the server function
``ledger_expire`` (migration 0004); the general batches then sweep everything else, and on
the other engines everything.
"""

from __future__ import annotations

from functools import partial

from quota_ledger.driver import dialect, pg_functions
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import applications, batches, resolve
from quota_ledger.ledger.rules import CompiledRules
from quota_ledger.model import queues, tracking
from quota_ledger.model.quantity import APPLICATIONS


def sweep(
    driver: DbQuotaDriver,
    rules: CompiledRules,
    *,
    batch_size: int,
    budget: batches.Budget,
    workers: int,
    pacer: batches.Pacer,
) -> int:
    """Expire what has run out in every partition; how many."""
    total = 0
    for partition in driver.partitions():
        if driver.functions:
            fast = partial(function_batch, driver, rules, partition, batch_size)
            total += batches.run(fast, batch_size, budget, workers, pacer)
        general = partial(
            driver.run, partial(general_batch, rules=rules, partition=partition, batch_size=batch_size)
        )
        total += batches.run(general, batch_size, budget, workers, pacer)
    return total


def function_batch(driver: DbQuotaDriver, rules: CompiledRules, partition: str, batch_size: int) -> int:
    """Expire up to ``batch_size`` plain reservations in one call of ``ledger_expire``; how many.

    The call declines when the configuration changed since the one it is given was compiled
    (which quotas count what depends on it): the new one is compiled and the call made again.
    """
    for _attempt in range(3):
        known = rules.known(driver.run)
        rows = driver.call(
            pg_functions.EXPIRE,
            {
                "partition": partition,
                "limit": batch_size,
                "skip": sorted(known.partition(partition).quotas),
                "version": known.version,
                "ns": dialect.ADVISORY_NAMESPACE,
                "k": dialect.advisory_key(partition),
            },
        )
        if rows is not None:
            return int(rows[0][0])
        if not driver.functions:
            return 0  # no functions in this database: the general batches sweep everything
        driver.run(rules.in_force)  # the configuration changed: compile the new one
    return 0  # it keeps changing: the general path sweeps what is left


def general_batch(tx: LedgerTx, rules: CompiledRules, partition: str, batch_size: int) -> int:
    """Expire up to ``batch_size`` pending reservations of a partition in one transaction,
    skipping rows another sweeper or a concurrent commit holds; how many."""
    now = tx.db_now()
    stored = tx.lock_expired(partition, batch_size, now)
    if not stored:
        return 0
    in_force = rules.partition(tx, partition)
    expiring = [s.reservation for s in stored]
    keys = {applications.key_of(r) for r in expiring if applications.tracked(r.user, r.application)}
    apps = tx.lock_apps(partition, keys)
    for reservation in expiring:
        if (app := apps.get(applications.key_of(reservation))) is not None:
            tracking.resolve(app, reservation.resources, {}, now)
    stopping = [a for a in apps.values() if tracking.idle(a) and resolve.stop(tx, a, now, "Expired")]
    for app in apps.values():
        tx.update_app(app)
    pairs = {(r.queue, res) for r in expiring for res in r.resources}
    resources = {res for _, res in pairs} | ({APPLICATIONS} if stopping else set())
    own = tx.lock_queue_counters(partition, pairs)
    scopes = {scope for r in expiring for scope in queues.lineage(r.queue)}
    limits = resolve.by_key(tx.lock_subtree_counters(partition, scopes, resources))
    scoped = applications.lock_of(tx, apps.values(), resources)
    deltas: dict[int, tuple[int, int]] = {}
    identity_deltas: dict[int, tuple[int, int]] = {}
    for reservation in expiring:
        for counter in resolve.counters_of(reservation, own, limits):
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
    resolve.leave_quotas(tx, in_force, stored, now)
    return tx.expire_reservations([r.id for r in expiring], now)
