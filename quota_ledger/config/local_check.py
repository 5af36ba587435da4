"""Checking one queue's new max without validating the whole configuration again.

:meth:`QuotaEngine.set_limits` changes one queue's max. Of YuniKorn's rules (see
:mod:`.validate` and :mod:`.limits_check`) only these involve a queue's max, so only these are
checked, on the queue, its ancestors and its subtree:

- the max parses (each value a quantity);
- the queue's guaranteed fits its max; its max fits the max above it (the smallest max of
  each resource among its ancestors); every queue of its subtree still fits the max above it,
  which may now come from this queue; the max in force at each queue of the subtree is still
  at least what its children are guaranteed together;
- each user and group limit of the queue fits the queue's max;
- the bounds (:class:`~quota_ledger.model.validation.Bounds`): the max names few enough
  resources, and the partition still names few enough distinct resources in all;
- the document stays within the nesting depth and value count every document is held to.

Everything else in the configuration is as it was when it was validated in full. The cost is
that of the queue's path and subtree: constant for a leaf, whatever the size of the rest.
An index of what these checks read (:class:`ConfigIndex`) is built once from a stored document
and then moved from version to version by :func:`advanced`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from quota_ledger.config import layered
from quota_ledger.config.limits_check import (
    Report,
    Resources,
    add,
    component_wise_min,
    fit_in_max_undef,
    human,
    is_zero,
    parse_map,
)
from quota_ledger.config.model import partition_name
from quota_ledger.config.queue_max import ROOT, set_max_resources, text
from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.values import ConfigProblem

#: how deep a queue of level 1 (root) sits in the document: document, partitions, partition,
#: queues, root; each level adds a queue list and a queue
_ROOT_DEPTH = 5


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """What the checks read of one configured queue."""

    path: str
    #: root = 1
    level: int
    #: the queue's ``resources`` as stored (guaranteed and max as text), or None
    resources: Mapping[str, Any] | None
    guaranteed: Resources
    maximum: Resources
    #: (how a problem names it, maxresources) of each user and group limit of the queue
    limits: tuple[tuple[str, Resources | None], ...]
    children: tuple[str, ...]

    @property
    def max_text(self) -> Mapping[str, str]:
        return (self.resources or {}).get("max") or {}


@dataclass(frozen=True, slots=True)
class PartitionIndex:
    name: str
    queues: Mapping[str, QueueFacts]
    #: resource name -> how many limit sets (max, guaranteed, user and group limits) name it
    uses: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class ConfigIndex:
    """What :func:`check_max` reads, for one configuration version."""

    version: int
    partitions: Mapping[str, PartitionIndex]
    #: how many values the stored document holds (see :func:`validation.document_problem`)
    values: int


@dataclass(frozen=True, slots=True)
class MaxChange:
    """A checked change of one queue's max: what it would change and why it may not."""

    partition: str
    queue: str
    problems: tuple[ConfigProblem, ...]
    #: resource -> new limit (None: removed), only those that change
    changes: Mapping[str, int | None]


def count_values(value: object) -> int:
    """How many values ``value`` holds, itself included, as :func:`validation.document_problem`
    counts them."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return count


def build(version: int, document: Mapping[str, Any]) -> ConfigIndex:
    """The index of a stored (normalized, validated) document."""
    partitions = {}
    for partition in document.get("partitions") or []:
        name = partition_name(partition.get("name") or "")
        uses: dict[str, int] = {}
        _count_uses(uses, [lim.get("maxresources") for lim in partition.get("limits") or []], 1)
        found: dict[str, QueueFacts] = {}
        pending = [(queue, "", 1) for queue in partition.get("queues") or []]
        while pending:
            node, parent, level = pending.pop()
            facts = _facts(node, f"{parent}.{node.get('name')}" if parent else str(node.get("name")), level)
            found[facts.path] = facts
            _count_uses(uses, _limit_sets(node), 1)
            pending.extend((child, facts.path, level + 1) for child in node.get("queues") or [])
        partitions[name] = PartitionIndex(name, layered.Layered(found), uses)
    return ConfigIndex(version, partitions, count_values(dict(document)))


def _facts(node: Mapping[str, Any], path: str, level: int) -> QueueFacts:
    resources = node.get("resources")
    limits = []
    for limit in node.get("limits") or []:
        label = limit.get("limit") or ",".join([*(limit.get("users") or []), *(limit.get("groups") or [])])
        parsed, errors = parse_map(limit.get("maxresources"))
        limits.append((label, None if errors else parsed))
    return QueueFacts(
        path=path,
        level=level,
        resources=resources,
        guaranteed=_parsed((resources or {}).get("guaranteed")),
        maximum=_parsed((resources or {}).get("max")),
        limits=tuple(limits),
        children=tuple(f"{path}.{child.get('name')}" for child in node.get("queues") or []),
    )


def _parsed(values: Mapping[str, str] | None) -> Resources:
    parsed, errors = parse_map(values)
    return {} if errors else parsed


def _limit_sets(node: Mapping[str, Any]) -> list[Mapping[str, Any] | None]:
    resources = node.get("resources") or {}
    sets = [resources.get("max"), resources.get("guaranteed")]
    return sets + [limit.get("maxresources") for limit in node.get("limits") or []]


def _count_uses(uses: dict[str, int], sets: list[Mapping[str, Any] | None], step: int) -> None:
    for names in sets:
        for name in names or ():
            uses[name] = uses.get(name, 0) + step
            if not uses[name]:
                del uses[name]


def configured(index: ConfigIndex, partition: str, queue: str) -> bool:
    """Whether ``queue`` is a configured queue of ``partition`` (root: the partition is)."""
    found = index.partitions.get(partition)
    return found is not None and queue in found.queues


def _next_facts(facts: QueueFacts, limits: Mapping[str, int | None]) -> QueueFacts:
    resources = copy.deepcopy(dict(facts.resources or {}))
    set_max_resources(resources, limits)
    return replace(facts, resources=resources or None, maximum=_parsed(resources.get("max")))


def check_max(
    index: ConfigIndex,
    partition: str,
    queue: str,
    limits: Mapping[str, int | None],
    bounds: validation.Bounds,
) -> MaxChange:
    """Check setting (None: removing) ``limits`` on the max of ``queue``, a configured queue
    other than root, as validating the whole configuration would."""
    part = index.partitions[partition]
    facts = part.queues[queue]
    current = facts.max_text
    changes = {
        resource: value
        for resource, value in limits.items()
        if current.get(resource) != (None if value is None else text(resource, value))
    }
    if not changes:
        return MaxChange(partition, queue, (), {})
    new = _next_facts(facts, changes)
    report = Report(partition)
    maximum = _check_own(report, new)
    new = replace(new, maximum=maximum)
    parent_max = _max_above(part.queues, queue)
    _check_subtree(report, part.queues, new, parent_max)
    _check_bounds(report, index, part, facts, new, bounds)
    return MaxChange(partition, queue, tuple(dict.fromkeys(report.problems)), changes)


def _check_own(report: Report, new: QueueFacts) -> Resources:
    """Problems of the new max itself and against the queue's own limits; returns the max as
    the other checks count it (one that does not parse counts as not set)."""
    maximum, errors = parse_map(new.max_text)
    for error in errors:
        report.add(f"the queue's max is invalid: {error}" if new.limits else error, queue=new.path)
    if errors:
        return {}
    for label, resources in new.limits:
        if resources is not None and not fit_in_max_undef(maximum, resources):
            report.add(
                f"maxresources ({human(resources)}) is more than the queue's max ({human(maximum)})",
                queue=new.path,
                limit=label,
            )
    return maximum


def _max_above(queues: Mapping[str, QueueFacts], queue: str) -> Resources:
    """The smallest max of each resource among the queue's ancestors (root counts none)."""
    segments = queue.split(".")
    above: Resources = {}
    for end in range(2, len(segments)):
        above = component_wise_min(queues[".".join(segments[:end])].maximum, above)
    return above


def _check_subtree(
    report: Report, queues: Mapping[str, QueueFacts], new: QueueFacts, parent_max: Resources
) -> None:
    """YuniKorn's ``checkQueueResource`` on the queue's subtree, with the queue's new facts."""

    def walk(facts: QueueFacts, above: Resources) -> Resources:
        guaranteed, maximum = facts.guaranteed, facts.maximum
        if not fit_in_max_undef(maximum, guaranteed):
            message = f"guaranteed ({human(guaranteed)}) is more than max ({human(maximum)})"
            report.add(message, queue=facts.path)
        if not fit_in_max_undef(above, maximum):
            message = f"max ({human(maximum)}) is more than the max above it ({human(above)})"
            report.add(message, queue=facts.path)
        effective = component_wise_min(maximum, above)
        children: Resources = {}
        for child in facts.children:
            children = add(children, walk(queues[child], effective))
        if not fit_in_max_undef(guaranteed, children):
            report.add(
                f"guaranteed ({human(guaranteed)}) is less than what the child queues are guaranteed "
                f"together ({human(children)})",
                queue=facts.path,
            )
        if not fit_in_max_undef(effective, children):
            report.add(
                f"max ({human(effective)}) is less than what the child queues are guaranteed together "
                f"({human(children)})",
                queue=facts.path,
            )
        return children if is_zero(guaranteed) else guaranteed

    walk(new, parent_max)


def _check_bounds(
    report: Report,
    index: ConfigIndex,
    part: PartitionIndex,
    old: QueueFacts,
    new: QueueFacts,
    bounds: validation.Bounds,
) -> None:
    """The resource bounds, and the document's depth and size."""
    if new.max_text:
        try:
            bounds.limit_set(new.max_text)
        except InvalidRequest as error:
            report.add(str(error), queue=new.path, limit="resources.max")
    uses = _uses_after(part.uses, old, new)
    try:
        bounds.partition(uses, part.name)
    except InvalidRequest as error:
        report.add(str(error))
    depth = _ROOT_DEPTH + 2 * (new.level - 1)
    if new.resources and validation.document_problem(new.resources, validation.MAX_DEPTH - depth):
        report.problems.append(
            ConfigProblem(
                partition="",
                queue="",
                limit="",
                message=f"the document nests deeper than {validation.MAX_DEPTH} levels",
            )
        )
    if _values_after(index, old, new) > validation.MAX_NODES:
        message = f"the document holds more than {validation.MAX_NODES} values"
        report.problems.append(ConfigProblem(partition="", queue="", limit="", message=message))


def _uses_after(uses: Mapping[str, int], old: QueueFacts, new: QueueFacts) -> dict[str, int]:
    after = dict(uses)
    _count_uses(after, [old.max_text], -1)
    _count_uses(after, [new.max_text], 1)
    return after


def _values_after(index: ConfigIndex, old: QueueFacts, new: QueueFacts) -> int:
    before = count_values(old.resources) if old.resources is not None else 0
    after = count_values(new.resources) if new.resources is not None else 0
    return index.values - before + after


def advanced(
    index: ConfigIndex, version: int, partition: str, queue: str, limits: Mapping[str, int | None]
) -> ConfigIndex:
    """The index of the next version, in which ``queue``'s max got ``limits`` (root's limits
    are not in the document: only the version moves)."""
    if queue == ROOT:
        return replace(index, version=version)
    part = index.partitions[partition]
    old = part.queues[queue]
    new = _next_facts(old, limits)
    moved = PartitionIndex(
        part.name, layered.updated(part.queues, {queue: new}), _uses_after(part.uses, old, new)
    )
    return ConfigIndex(version, {**index.partitions, partition: moved}, _values_after(index, old, new))
