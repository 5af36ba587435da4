"""A validated configuration compiled into the questions the ledger asks on every request.

Pure: no SQL. ``PartitionRules`` answers which queue limits exist, which user and group limits
apply to a request at each level of its queue path, and which group an application is tracked
against (YuniKorn's ``ensureGroup`` walk).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from quota_ledger.config import layered
from quota_ledger.config.amounts import parse_config_resources
from quota_ledger.config.model import QUEUEING_POLICY, STRICT_FIFO, Queue, SchedulerConfig
from quota_ledger.config.queue_max import ROOT, text
from quota_ledger.kube import admission as kube_admission
from quota_ledger.kube import quotas as kube_quotas
from quota_ledger.kube.admission import AdmissionConfig
from quota_ledger.kube.quotas import ResourceQuota
from quota_ledger.model import queues
from quota_ledger.model.quantity import APPLICATIONS

WILDCARD = "*"
USER = "user"
GROUP = "group"


@dataclass(frozen=True, slots=True)
class LimitRule:
    """One user or group limit at one queue: resources and running applications."""

    resources: Mapping[str, int]
    #: 0 = not limited
    max_applications: int = 0

    def counters(self) -> dict[str, int]:
        """Counter resource -> limit, with ``applications`` where the count is limited."""
        limits = dict(self.resources)
        if self.max_applications:
            limits[APPLICATIONS] = self.max_applications
        return limits


@dataclass(frozen=True, slots=True)
class QueueRule:
    """What one configured queue limits."""

    path: str
    max: Mapping[str, int] = field(default_factory=dict)
    #: 0 = not limited
    max_applications: int = 0
    users: Mapping[str, LimitRule] = field(default_factory=dict)
    groups: Mapping[str, LimitRule] = field(default_factory=dict)
    #: named groups in configuration order: the order of the group selection walk
    group_order: tuple[str, ...] = ()
    #: its own ``queueing.policy`` property (None: its parent's)
    policy: str | None = None


@dataclass(frozen=True, slots=True)
class IdentityScope:
    """A user or group limit that a request must fit: (kind, name) at one queue."""

    kind: str
    name: str
    queue: str
    rule: LimitRule


@dataclass(frozen=True, slots=True)
class PartitionRules:
    name: str
    queues: Mapping[str, QueueRule] = field(default_factory=dict)
    #: root's limits (YuniKorn's cluster size): set with ``set_limits("root", ...)``
    capacity: Mapping[str, int] = field(default_factory=dict)
    #: queue -> the Kubernetes ResourceQuotas of the namespace placed there
    quotas: Mapping[str, tuple[ResourceQuota, ...]] = field(default_factory=dict)
    admission: AdmissionConfig | None = None
    #: ``unknownnames: refuse``: a name the configuration does not know is refused, not warned
    refuses_unknown_names: bool = False

    def quota(self, key: str) -> ResourceQuota | None:
        return next((q for qs in self.quotas.values() for q in qs if q.key == key), None)

    #: whether a queue of the partition is ``StrictFIFO`` (no request passes a waiting one
    #: ahead of it in a line they share)
    has_strict_lines: bool = False

    def strict(self, queue: str) -> bool:
        """Whether ``queue``'s line is ``StrictFIFO``: its own ``queueing.policy``, else its
        nearest configured ancestor's; ``BestEffortFIFO`` when none says."""
        path = queue
        while True:
            rule = self.queues.get(path)
            if rule is not None and rule.policy is not None:
                return rule.policy == STRICT_FIFO
            if "." not in path:
                return False
            path = path.rsplit(".", 1)[0]

    @property
    def has_identity_limits(self) -> bool:
        return any(q.users or q.groups for q in self.queues.values())

    def queue_limits(self) -> dict[tuple[str, str], int]:
        """(queue, resource) -> limit for every queue max, maxapplications and root capacity."""
        limits: dict[tuple[str, str], int] = {("root", res): v for res, v in self.capacity.items()}
        for rule in self.queues.values():
            for resource, value in rule.max.items():
                limits[(rule.path, resource)] = value
            if rule.max_applications:
                limits[(rule.path, APPLICATIONS)] = rule.max_applications
        return limits

    def user_rule(self, path: str, user: str) -> LimitRule | None:
        """The user's limit at exactly ``path``: a named limit wins over the wildcard."""
        rule = self.queues.get(path)
        if rule is None:
            return None
        return rule.users.get(user) or rule.users.get(WILDCARD)

    def select_group(self, queue: str, groups: tuple[str, ...] | list[str]) -> str | None:
        """The group an application is tracked against, chosen once when it is first seen.

        From the leaf up: the first configured named group (in config order) the user belongs
        to, else the group wildcard at that level, else one level up. No groups, no tracking.
        """
        if not groups:
            return None
        member = set(groups)
        for path in reversed(queues.lineage(queue)):
            rule = self.queues.get(path)
            if rule is None:
                continue
            for name in rule.group_order:
                if name in member:
                    return name
            if WILDCARD in rule.groups:
                return WILDCARD
        return None

    def identity_scopes(self, queue: str, user: str | None, group: str | None) -> list[IdentityScope]:
        """Every user and group limit on ``queue``'s path, root first; both must hold."""
        found = []
        for path in queues.lineage(queue):
            rule = self.queues.get(path)
            if rule is None:
                continue
            if user is not None and (limit := self.user_rule(path, user)) is not None:
                found.append(IdentityScope(USER, user, path, limit))
            if group is not None and (limit := rule.groups.get(group)) is not None:
                found.append(IdentityScope(GROUP, group, path, limit))
        return found

    def group_limited(self, queue: str, group: str) -> bool:
        """Whether ``group`` still has a limit anywhere on ``queue``'s path."""
        return any(group in (r.groups if (r := self.queues.get(p)) else {}) for p in queues.lineage(queue))


@dataclass(frozen=True, slots=True)
class Rules:
    """A compiled configuration version."""

    version: int
    partitions: Mapping[str, PartitionRules] = field(default_factory=dict)

    def partition(self, name: str) -> PartitionRules:
        return self.partitions.get(name) or PartitionRules(name)


def with_queue_max(
    rules: Rules, version: int, partition: str, queue: str, limits: Mapping[str, int | None]
) -> Rules:
    """``rules`` as the next version, in which ``queue``'s max (root: the partition's capacity)
    got ``limits`` (None removes one); shares every other queue's rules with ``rules``. A queue
    not configured yet is added, with the levels missing above it."""
    current = rules.partition(partition)
    if queue == ROOT:
        capacity = {**current.capacity, **limits}
        changed = replace(current, capacity={r: v for r, v in sorted(capacity.items()) if v is not None})
    elif queue not in current.queues:  # added, with the levels missing above it
        added = {path: QueueRule(path) for path in queues.lineage(queue) if path not in current.queues}
        maximum = {r: text(r, v) for r, v in limits.items() if v is not None}
        added[queue] = QueueRule(queue, max=parse_config_resources(maximum))
        changed = replace(current, queues=layered.updated(current.queues, added))
    else:
        rule = current.queues[queue]
        texts = {r: text(r, v) for r, v in rule.max.items()}
        texts.update({r: text(r, v) for r, v in limits.items() if v is not None})
        for resource in (r for r, v in limits.items() if v is None):
            texts.pop(resource, None)
        rule = replace(rule, max=parse_config_resources(texts))
        changed = replace(current, queues=layered.updated(current.queues, {queue: rule}))
    return Rules(version, {**rules.partitions, partition: changed})


def compile_config(
    config: SchedulerConfig,
    capacity: Mapping[str, Mapping[str, int]],
    version: int,
    kube: Mapping[str, Any] | None = None,
) -> Rules:
    """Compile a normalized, validated configuration, with the Kubernetes objects stored next
    to it (``{partition: {"quotas": {ns/name: {"queue", "manifest"}}, "admission": manifest}}``)."""
    kube = kube or {}
    queue_rules: dict[str, dict[str, QueueRule]] = {}
    refusing = {p.name for p in config.partitions if p.unknownnames == "refuse"}
    for partition in config.partitions:
        found: dict[str, QueueRule] = {}
        for top in partition.queues or ():
            _walk(top, "", found)
        queue_rules[partition.name] = found
    names = set(queue_rules) | set(capacity) | set(kube)
    partitions = {}
    for name in names:
        objects = kube.get(name, {})
        quotas: dict[str, list[ResourceQuota]] = {}
        for entry in objects.get("quotas", {}).values():
            quotas.setdefault(entry["queue"], []).append(kube_quotas.parse(entry["manifest"]))
        admission = objects.get("admission")
        partitions[name] = PartitionRules(
            name,
            queue_rules.get(name, {}),
            dict(capacity.get(name, {})),
            {queue: tuple(sorted(qs, key=lambda q: q.key)) for queue, qs in quotas.items()},
            kube_admission.parse(admission) if admission is not None else None,
            refuses_unknown_names=name in refusing,
            has_strict_lines=any(r.policy == STRICT_FIFO for r in queue_rules.get(name, {}).values()),
        )
    return Rules(version, partitions)


def _walk(queue: Queue, parent: str, found: dict[str, QueueRule]) -> None:
    path = f"{parent}.{queue.name}" if parent else queue.name
    users: dict[str, LimitRule] = {}
    groups: dict[str, LimitRule] = {}
    order: list[str] = []
    for limit in queue.limits:
        rule = LimitRule(parse_config_resources(limit.maxresources), limit.maxapplications)
        for user in limit.users:
            if user:
                users.setdefault(user, rule)
        for group in limit.groups:
            if group:
                groups.setdefault(group, rule)
                if group != WILDCARD and group not in order:
                    order.append(group)
    maximum = queue.resources.max if queue.resources is not None and queue.resources.max else {}
    found[path] = QueueRule(
        path=path,
        max=parse_config_resources(maximum),
        max_applications=queue.maxapplications,
        users=users,
        groups=groups,
        group_order=tuple(order),
        policy=queue.properties.get(QUEUEING_POLICY),
    )
    for child in queue.queues:
        _walk(child, path, found)
