"""Which counters at zero something still references, and which ``prune`` may remove. Pure.

A counter at zero is kept while the configuration knows its names, or the ledger's live rows
name them: a queue counter whose queue is configured (or lies below a configured queue other
than root) and whose resource some limit names, or that a pending reservation names; a user or
group counter of a limit the configuration names for that user or group at that queue, or of a
user or group that has a pending reservation or a running application; a ResourceQuota counter
of a quota that still exists. What is left is what typos, departed users and removed queues
leave behind: rows that reserve re-creates if it ever needs them again.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from quota_ledger.config import typos
from quota_ledger.config.rules import GROUP, USER, LimitRule, PartitionRules
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.values import IdleCounter


@dataclass(frozen=True, slots=True)
class Live:
    """What the ledger's live rows name in one partition."""

    #: (queue, resource) of every pending reservation's items
    pending: Set[tuple[str, str]] = frozenset()
    #: users with a pending reservation or a running application
    users: Set[str] = frozenset()
    #: groups a running application is tracked against
    groups: Set[str] = frozenset()


def idle(rules: PartitionRules, counter: IdleCounter, live: Live) -> bool:
    """Whether nothing references ``counter`` (a counter at zero): ``prune`` may remove it."""
    if counter.kind == "quota":
        return rules.quota(counter.name or "") is None
    if counter.kind in (USER, GROUP):
        name = counter.name or ""
        if name in (live.users if counter.kind == USER else live.groups):
            return False
        rule = rules.queues.get(counter.queue)
        limits = (rule.users if counter.kind == USER else rule.groups) if rule is not None else {}
        return not _limits(limits.get(name), counter.resource)
    if (counter.queue, counter.resource) in live.pending:
        return False
    return not (_queue_known(rules, counter.queue) and _resource_known(rules, counter.resource))


def _limits(rule: LimitRule | None, resource: str) -> bool:
    if rule is None:
        return False
    return resource in rule.resources or (resource == APPLICATIONS and rule.max_applications > 0)


def _queue_known(rules: PartitionRules, queue: str) -> bool:
    _limited, queues = typos.known(rules)
    parts = queue.split(".")
    return queue in queues or any(".".join(parts[:n]) in queues for n in range(2, len(parts)))


def _resource_known(rules: PartitionRules, resource: str) -> bool:
    limited, _queues = typos.known(rules)
    return resource == APPLICATIONS or resource in limited
