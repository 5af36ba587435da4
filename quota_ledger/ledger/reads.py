"""Reads: usage, limits, user/group reports, ResourceQuota status and listings of reservations.
Nothing here locks a counter or writes; a read that combines several tables runs in one
REPEATABLE READ snapshot (the engine asks the driver for it), so it never mixes two states of
the ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from quota_ledger.config import reports
from quota_ledger.config.rules import PartitionRules
from quota_ledger.driver import listing
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.kube import quotas as kube_quotas
from quota_ledger.ledger.compiled import CompiledRules
from quota_ledger.model.counters import QUEUE, QUOTA, SUBTREE
from quota_ledger.model.errors import ResourceQuotaNotFound
from quota_ledger.model.listing import ReservationQuery
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Reservation, ReservationState, Usage

T = TypeVar("T")


def namespace_queue(tx: LedgerTx, partition: str, namespace: str) -> str:
    """The queue a namespace's pods are charged to: where it was placed, else ``root.<namespace>``."""
    return tx.namespace_queue(partition, namespace) or f"root.{namespace}"


def usage(tx: LedgerTx, partition: str, queue: str) -> dict[str, Usage]:
    """Usage of ``queue``'s whole subtree per resource, with the queue's own limit (the sum of
    the queue counters below it where no limit is set)."""
    rows = tx.usage_rows(partition, queue)
    limits = {c.resource: c for c in rows if c.scope_type == SUBTREE}
    totals: dict[str, tuple[int, int]] = {}
    for counter in rows:
        if counter.scope_type == QUEUE:
            in_use, reserved = totals.get(counter.resource, (0, 0))
            totals[counter.resource] = (in_use + counter.in_use, reserved + counter.reserved)
    result = {}
    for resource in sorted(limits.keys() | totals.keys()):
        if resource in limits:
            c = limits[resource]
            result[resource] = Usage(in_use=c.in_use, reserved=c.reserved, limit=c.limit)
        else:
            in_use, reserved = totals[resource]
            result[resource] = Usage(in_use=in_use, reserved=reserved, limit=None)
    return result


def limits(tx: LedgerTx, partition: str) -> dict[str, dict[str, int]]:
    """Every limit in the partition: ``{queue: {resource: limit}}``."""
    result: dict[str, dict[str, int]] = {}
    for counter in tx.all_limits(partition):
        assert counter.limit is not None
        result.setdefault(counter.scope, {})[counter.resource] = counter.limit
    return result


def report(
    tx: LedgerTx,
    rules: CompiledRules,
    partition: str,
    build: Callable[[PartitionRules, list[AppState]], T],
    kind: str | None,
    name: str | None,
) -> T:
    """``build`` applied to the rules in force and the application rows of ``kind`` ``name``
    (every row when ``kind`` is None)."""
    return build(rules.partition(tx, partition), tx.read_apps(partition, kind, name))


def quota_status(tx: LedgerTx, rules: CompiledRules, partition: str, key: str) -> dict[str, Any]:
    """``{"hard": {...}, "used": {...}}`` of the ResourceQuota ``namespace/name``, in
    Kubernetes quantities."""
    quota = rules.partition(tx, partition).quota(key)
    if quota is None:
        raise ResourceQuotaNotFound(key)
    counters = tx.identity_counters(partition, lock=False, kinds=[QUOTA])
    used = {c.resource: c.in_use for c in counters if c.name == key}
    return {
        "hard": {res: kube_quotas.format_value(res, v) for res, v in quota.hard.items()},
        "used": {res: kube_quotas.format_value(res, used.get(res, 0)) for res in quota.hard},
    }


def quota_names(tx: LedgerTx, rules: CompiledRules, partition: str) -> list[tuple[str, str]]:
    """(namespace, name) of every ResourceQuota in the partition."""
    found = rules.partition(tx, partition).quotas.values()
    return sorted((q.namespace, q.name) for qs in found for q in qs)


def all_users(rules: PartitionRules, apps: list[AppState]) -> list[dict[str, Any]]:
    """Every tracked or configured user's usage tree (a ``build`` for :func:`report`)."""
    found = (reports.user_report(rules, u, apps) for u in reports.user_names(rules, apps))
    return [r for r in found if r is not None]


def all_groups(rules: PartitionRules, apps: list[AppState]) -> list[dict[str, Any]]:
    """Every tracked or configured group's usage tree (a ``build`` for :func:`report`)."""
    found = (reports.group_report(rules, g, apps) for g in reports.group_names(rules, apps))
    return [r for r in found if r is not None]


def reservations(tx: LedgerTx, wanted: ReservationQuery) -> list[Reservation]:
    """The reservations ``wanted`` names, oldest first, at most its limit; ``older_than``
    counts against the database's clock."""
    return listing.find_reservations(tx.conn, wanted, tx.db_now(), wanted.limit)


def held_keys(tx: LedgerTx, partition: str) -> dict[str, tuple[str, ReservationState]]:
    """key -> (reservation id, state) of the partition's keyed reservations that still hold
    something: pending, or committed and not released."""
    return {key: (rid, ReservationState(state)) for key, rid, state in listing.held_keys(tx.conn, partition)}
