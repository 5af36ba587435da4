"""ResourceQuota steps inside the ledger's transactions: admit, lock, recompute.

A quota counter (``quota_identity_usages`` with ``kind='quota'``, name ``namespace/name``) holds,
for one hard resource, the sum over the live reservations of its queue (pending, or committed
and not released) that the quota matches *now*. Reserve adds a reservation's usage; rollback,
expiry and release subtract it; commit changes nothing (Kubernetes counts a pod from admission
to deletion). Every quota change recomputes the counters from the live reservations under the
exclusive partition lock, so a quota created or re-scoped later counts the pods already there.
Lock order after the user/group counters: quota counters, sorted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from quota_ledger.config.rules import PartitionRules
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.kube import admission
from quota_ledger.kube import quotas as kube_quotas
from quota_ledger.kube.pods import PodScopes
from quota_ledger.kube.quotas import ResourceQuota
from quota_ledger.model.counters import QUOTA, Counter
from quota_ledger.model.errors import MissingCoveringQuota, PodMissingResources, ResourceQuotaNotFound

KubeEdit = Callable[[dict[str, Any]], None]

_CONSTRAINED = ("cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory")


def admit(
    rules: PartitionRules,
    queue: str,
    namespace: str,
    kube: Mapping[str, Any],
    missing: Mapping[str, Mapping[str, list[str]]] | None = None,
) -> list[ResourceQuota]:
    """The quotas a request must fit; refuses it when a covering quota is missing or a matching
    quota tracks a value some containers do not set."""
    if rules.admission is None and queue not in rules.quotas:
        return []  # nothing configured to fit
    quotas = rules.quotas.get(queue, ())
    scopes = PodScopes.from_dict(kube["scopes"])
    usage = kube["usage"]
    if rules.admission is not None:
        names, uncovered = admission.uncovered(rules.admission, scopes, usage, quotas)
        if names or uncovered:
            raise MissingCoveringQuota(namespace, names, [r.describe() for r in uncovered])
    matching = [q for q in quotas if q.matches(scopes)]
    missing = missing or {}
    for quota in matching:
        gaps = {}
        for name in _CONSTRAINED:
            if name in quota.hard:
                kind = "limits" if name.startswith("limits.") else "requests"
                if containers := missing.get(kind, {}).get(name.rsplit(".", 1)[-1]):
                    gaps[name] = containers
        if gaps:
            raise PodMissingResources(quota.key, gaps)
    return matching


def matching(rules: PartitionRules, queue: str, kube: Mapping[str, Any] | None) -> list[ResourceQuota]:
    if not kube:
        return []
    scopes = PodScopes.from_dict(kube["scopes"])
    return [q for q in rules.quotas.get(queue, ()) if q.matches(scopes)]


def charged_keys(quotas: Iterable[ResourceQuota], usage: Mapping[str, int]) -> set[tuple[str, str]]:
    """(quota key, tracked name) of every quota counter ``usage`` adds to."""
    return {(q.key, name) for q in quotas for name in q.tracked() if usage.get(name, 0) > 0}


def lock_many(
    tx: LedgerTx,
    partition: str,
    charged: Sequence[tuple[str, Sequence[ResourceQuota], Mapping[str, int]]],
) -> list[list[Counter]]:
    """Lock the counters that requests (queue, quotas, usage) are charged to, with one
    statement; each request's counters, in order."""
    wanted = [{(key, name) for key, name in charged_keys(quotas, usage)} for _, quotas, usage in charged]
    if not any(wanted):
        return [[] for _ in charged]
    found = tx.lock_identity_counters(
        partition,
        {(QUOTA, key) for each in wanted for key, _ in each},
        {queue for (queue, _, _), each in zip(charged, wanted, strict=True) if each},
        {name for each in wanted for _, name in each},
    )
    return [
        [c for c in found if c.scope == queue and (c.name, c.resource) in each]
        for (queue, _, _), each in zip(charged, wanted, strict=True)
    ]


def desired(
    rules: PartitionRules, live: Iterable[tuple[str, str, dict[str, Any] | None]]
) -> dict[tuple[str, str, str], tuple[int, int]]:
    """(quota key, queue, resource) -> (used, hard) for every counter the quotas need."""
    by_queue: dict[str, list[dict[str, Any]]] = {}
    for _, queue, kube in live:
        if kube:
            by_queue.setdefault(queue, []).append(kube)
    found = {}
    for queue, quotas in rules.quotas.items():
        rows = by_queue.get(queue, [])
        for quota in quotas:
            members = [k for k in rows if quota.matches(PodScopes.from_dict(k["scopes"]))]
            for name in quota.tracked():
                used = sum(k["usage"].get(name, 0) for k in members)
                found[(quota.key, queue, name)] = (used, quota.hard[name])
    return found


def queues_to_lock(rules: PartitionRules, counters: Iterable[Counter]) -> set[str]:
    return set(rules.quotas) | {c.scope for c in counters}


def reconcile(
    tx: LedgerTx,
    rules: PartitionRules,
    live: Iterable[tuple[str, str, dict[str, Any] | None]],
    now: datetime,
) -> None:
    """Make the quota counters exactly what the quotas and live reservations say (caller holds
    the exclusive partition lock and the live reservations' rows)."""
    partition = rules.name
    current = {
        (c.name or "", c.scope, c.resource): c
        for c in tx.identity_counters(partition, lock=True, kinds=[QUOTA])
    }
    wanted = desired(rules, live)
    tx.delete_identity_counters([c.id for key, c in current.items() if key not in wanted])
    updates = {}
    for key, counter in current.items():
        if key in wanted:
            used, hard = wanted[key]
            if (counter.in_use, counter.reserved, counter.limit) != (used, 0, hard):
                updates[counter.id] = (used, 0, hard)
    tx.set_identity_counters(updates, now)
    tx.insert_identity_counters(
        partition,
        {
            (QUOTA, key, queue, name): (used, 0, hard)
            for (key, queue, name), (used, hard) in wanted.items()
            if (key, queue, name) not in current
        },
        now,
    )


# -- edits of the stored Kubernetes objects (applied as a configuration change) ----------------
def put(partition: str, key: str, manifest: dict[str, Any]) -> KubeEdit:
    """Create or replace the ResourceQuota ``key`` (``namespace/name``)."""

    def edit(kube: dict[str, Any]) -> None:
        entries = kube.setdefault(partition, {}).setdefault("quotas", {})
        entries[key] = {"queue": "", "manifest": manifest}

    return edit


def remove(partition: str, key: str) -> KubeEdit:
    """Delete the ResourceQuota ``key``; :class:`ResourceQuotaNotFound` if there is none."""

    def edit(kube: dict[str, Any]) -> None:
        entries = kube.get(partition, {}).get("quotas", {})
        if key not in entries:
            raise ResourceQuotaNotFound(key)
        del entries[key]

    return edit


def set_admission(partition: str, manifest: Mapping[str, Any] | None) -> KubeEdit:
    """Set the admission plugin's configuration (None removes it)."""

    def edit(kube: dict[str, Any]) -> None:
        objects = kube.setdefault(partition, {})
        if manifest is None:
            objects.pop("admission", None)
        else:
            objects["admission"] = kube_quotas.json_safe(manifest)

    return edit
