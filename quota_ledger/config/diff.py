"""What a configuration would change: the limits it adds, removes and changes, and who would then
be over a limit. Pure: compiled rules and current usage in, a :class:`ConfigDiff` out.

A limit is one number on one resource: a queue's ``max`` (root's capacity included) or
``maxapplications``, or a user or group limit at a queue (``maxresources`` and
``maxapplications``; ``*`` is the wildcard entry of the configuration). Amounts are base units,
as everywhere in the API; ``applications`` counts running applications.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from quota_ledger.config import identity
from quota_ledger.config.rules import GROUP, USER, PartitionRules, Rules
from quota_ledger.model import drift
from quota_ledger.model.counters import QUEUE, Counter
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.tracking import AppState

QUEUE_LIMIT = "queue"
#: (kind, name, queue, resource); name is None for a queue limit
Key = tuple[str, str | None, str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitChange:
    """One limit a configuration adds (``old`` None), removes (``new`` None) or changes."""

    partition: str
    #: ``queue``, ``user`` or ``group``
    kind: str
    #: the user or group (``*``: the wildcard entry); None for a queue limit
    name: str | None
    queue: str
    resource: str
    old: int | None
    new: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class OverLimit:
    """A queue, user or group whose current usage would be over its limit under the new
    configuration. Nothing is evicted: new reservations there are refused until usage drops."""

    partition: str
    kind: str
    #: the user or group (a real user where a wildcard limit applies); None for a queue
    name: str | None
    queue: str
    resource: str
    in_use: int
    reserved: int
    limit: int
    #: the limit in force now (None: none); ``in_use + reserved > old_limit`` means already over
    old_limit: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigDiff:
    """A dry run of :meth:`~quota_ledger.QuotaEngine.apply_config` against the version in force."""

    #: the version in force, compared against
    version: int
    #: applying it would change nothing and make no new version
    identical: bool
    added: tuple[LimitChange, ...]
    removed: tuple[LimitChange, ...]
    changed: tuple[LimitChange, ...]
    over_limit: tuple[OverLimit, ...]
    #: partitions that have limits now and would have none: applying needs confirmation
    removes_all_limits: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of ``POST /v1/config/diff`` (see docs/configuration-changes.md)."""
        return {
            "version": self.version,
            "identical": self.identical,
            "limits": {
                "added": [asdict(c) for c in self.added],
                "removed": [asdict(c) for c in self.removed],
                "changed": [asdict(c) for c in self.changed],
            },
            "over_limit": [asdict(o) for o in self.over_limit],
            "removes_all_limits": list(self.removes_all_limits),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConfigDiff:
        """The inverse of :meth:`as_dict`."""
        limits = data["limits"]
        return cls(
            version=int(data["version"]),
            identical=bool(data["identical"]),
            added=tuple(LimitChange(**c) for c in limits["added"]),
            removed=tuple(LimitChange(**c) for c in limits["removed"]),
            changed=tuple(LimitChange(**c) for c in limits["changed"]),
            over_limit=tuple(OverLimit(**o) for o in data["over_limit"]),
            removes_all_limits=tuple(data["removes_all_limits"]),
        )


def limit_table(rules: PartitionRules) -> dict[Key, int]:
    """Every limit the partition's configuration sets, as written (wildcards not expanded)."""
    found: dict[Key, int] = {
        (QUEUE_LIMIT, None, queue, resource): value
        for (queue, resource), value in rules.queue_limits().items()
    }
    for rule in rules.queues.values():
        for kind, entries in ((USER, rule.users), (GROUP, rule.groups)):
            for name, limit in entries.items():
                for resource, value in limit.counters().items():
                    found[(kind, name, rule.path, resource)] = value
    return found


def emptied_partitions(old: Rules, new: Rules) -> list[str]:
    """Partitions that have at least one limit under ``old`` and none under ``new``."""
    names = sorted(set(old.partitions) | set(new.partitions))
    return [n for n in names if limit_table(old.partition(n)) and not limit_table(new.partition(n))]


def changes(partition: str, old: PartitionRules, new: PartitionRules) -> list[LimitChange]:
    """Every limit added, removed or changed in one partition, sorted."""
    before, after = limit_table(old), limit_table(new)
    found = []
    for key in sorted(before.keys() | after.keys(), key=_order):
        if before.get(key) != after.get(key):
            kind, name, queue, resource = key
            found.append(
                LimitChange(
                    partition=partition,
                    kind=kind,
                    name=name,
                    queue=queue,
                    resource=resource,
                    old=before.get(key),
                    new=after.get(key),
                )
            )
    return found


def over_limits(
    partition: str,
    old: PartitionRules,
    new: PartitionRules,
    counters: Iterable[Counter],
    apps: Iterable[AppState],
) -> list[OverLimit]:
    """Every limit of ``new`` that the partition's current usage exceeds."""
    app_list = list(apps)
    usage = _queue_usage(counters, app_list)
    old_queue, found = old.queue_limits(), []
    for (queue, resource), limit in sorted(new.queue_limits().items()):
        in_use, reserved = usage(queue, resource)
        if in_use + reserved > limit:
            found.append(
                OverLimit(
                    partition=partition,
                    kind=QUEUE_LIMIT,
                    name=None,
                    queue=queue,
                    resource=resource,
                    in_use=in_use,
                    reserved=reserved,
                    limit=limit,
                    old_limit=old_queue.get((queue, resource)),
                )
            )
    old_named = identity.desired(old, app_list)
    for key, limit in sorted(identity.desired(new, app_list).items()):
        in_use, reserved = identity.value(app_list, key)
        if in_use + reserved > limit:
            kind, name, queue, resource = key
            found.append(
                OverLimit(
                    partition=partition,
                    kind=kind,
                    name=name,
                    queue=queue,
                    resource=resource,
                    in_use=in_use,
                    reserved=reserved,
                    limit=limit,
                    old_limit=old_named.get(key),
                )
            )
    return found


def _queue_usage(counters: Iterable[Counter], apps: list[AppState]) -> Callable[[str, str], tuple[int, int]]:
    """(queue, resource) -> (in_use, reserved) of the queue's subtree."""
    own = [c for c in counters if c.scope_type == QUEUE]
    in_use = drift.subtree_totals({(c.scope, c.resource): c.in_use for c in own})
    reserved = drift.subtree_totals({(c.scope, c.resource): c.reserved for c in own})
    running = identity.queue_app_counts(apps)

    def usage(queue: str, resource: str) -> tuple[int, int]:
        if resource == APPLICATIONS:
            return identity.subtree_count(running, queue), 0
        return in_use.get((queue, resource), 0), reserved.get((queue, resource), 0)

    return usage


def _order(key: Key) -> tuple[str, str, str, str]:
    kind, name, queue, resource = key
    return (queue, kind, name or "", resource)
