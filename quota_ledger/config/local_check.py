"""Checking one queue's new max without validating the whole configuration again.

:meth:`QuotaEngine.set_limits` changes one queue's max. Of YuniKorn's rules (see
:mod:`.validate` and :mod:`.user_group_checks`) only these involve a queue's max, so only these are
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

Adding a queue not configured yet (with the levels missing above it) is checked by
:func:`new_queue` against the rules a new child involves: names, siblings' names in any case,
the parent's maxapplications, the max above, and the same bounds. It only says when the addition
is certainly valid; anything else is left to the whole check, which reports every problem.
An index of what these checks read (:class:`ConfigIndex`) is built once from a stored document
and then moved from version to version by :func:`advanced`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from quota_ledger.config import layered
from quota_ledger.config.model import MANAGED_BY, partition_name
from quota_ledger.config.queue_max import ROOT, set_max_resources, text
from quota_ledger.config.user_group_checks import (
    Report,
    Resources,
    add,
    component_wise_min,
    fit_in_max_undef,
    human,
    is_zero,
    parse_map,
)
from quota_ledger.config.validate import QUEUE_NAME
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
    #: the child queues' paths (a tuple, or a :class:`~.layered.Appended` once one was added)
    children: Sequence[str]
    #: the queue's maxapplications (0: not set)
    max_applications: int = 0
    #: what owns the queue's limits (its property :data:`~.model.MANAGED_BY`), or None
    managed_by: str | None = None

    @property
    def max_text(self) -> Mapping[str, str]:
        return (self.resources or {}).get("max") or {}


@dataclass(frozen=True, slots=True)
class PartitionIndex:
    name: str
    queues: Mapping[str, QueueFacts]
    #: resource name -> how many limit sets (max, guaranteed, user and group limits) name it
    uses: Mapping[str, int]
    #: ``parent path + "/" + lower-case name`` of every queue but root: the names a new child
    #: may not take (YuniKorn's names ignore case)
    names: Mapping[str, str]
    #: whether the partition has placement rules (they name queues a new queue may change)
    placement: bool


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
        names: dict[str, str] = {}
        pending = [(queue, "", 1) for queue in partition.get("queues") or []]
        while pending:
            node, parent, level = pending.pop()
            facts = _facts(node, f"{parent}.{node.get('name')}" if parent else str(node.get("name")), level)
            found[facts.path] = facts
            if parent:
                names[_name_key(parent, str(node.get("name")))] = facts.path
            _count_uses(uses, _limit_sets(node), 1)
            pending.extend((child, facts.path, level + 1) for child in node.get("queues") or [])
        placement = bool(partition.get("placementrules"))
        partitions[name] = PartitionIndex(
            name, layered.Layered(found), uses, layered.Layered(names), placement
        )
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
        max_applications=int(node.get("maxapplications") or 0),
        managed_by=(node.get("properties") or {}).get(MANAGED_BY),
    )


def _name_key(parent: str, name: str) -> str:
    return f"{parent}/{name.lower()}"


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


def manager(index: ConfigIndex, partition: str, queue: str) -> tuple[str, str] | None:
    """(the queue, what owns it) of the nearest configured queue on ``queue``'s path, itself
    included, whose limits something outside the ledger owns; None when none is."""
    found = index.partitions.get(partition)
    if found is None:
        return None
    segments = queue.split(".")
    for end in range(len(segments), 1, -1):
        facts = found.queues.get(".".join(segments[:end]))
        if facts is not None and facts.managed_by:
            return facts.path, facts.managed_by
    return None


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


def _max_above(queues: Mapping[str, QueueFacts], queue: str, known: int | None = None) -> Resources:
    """The smallest max of each resource among the queue's ancestors (root counts none); only
    the first ``known`` levels of its path when given (those below are new, without a max)."""
    segments = queue.split(".")
    above: Resources = {}
    for end in range(2, len(segments) if known is None else known + 1):
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


def _uses_after(uses: Mapping[str, int], old: QueueFacts | None, new: QueueFacts) -> dict[str, int]:
    after = dict(uses)
    if old is not None:
        _count_uses(after, [old.max_text], -1)
    _count_uses(after, [new.max_text], 1)
    return after


def _values_after(index: ConfigIndex, old: QueueFacts, new: QueueFacts) -> int:
    before = count_values(old.resources) if old.resources is not None else 0
    after = count_values(new.resources) if new.resources is not None else 0
    return index.values - before + after


@dataclass(frozen=True, slots=True)
class NewQueue:
    """A queue not configured yet that setting limits adds, with the levels missing above it,
    found certainly valid: adding it breaks none of YuniKorn's rules."""

    partition: str
    queue: str
    #: the configured queue the new levels hang under
    parent: str
    #: the paths added, top first (the last is ``queue``)
    created: tuple[str, ...]
    #: resource -> limit of the new queue's max
    limits: Mapping[str, int]


def new_queue(
    index: ConfigIndex,
    partition: str,
    queue: str,
    limits: Mapping[str, int | None],
    bounds: validation.Bounds,
) -> NewQueue | None:
    """Check adding ``queue`` (a valid queue path not configured yet) with ``limits`` on its max,
    as validating the whole configuration would; None unless it is certainly accepted.

    Adding a leaf (and the levels missing above it) touches only these rules: each new name is
    valid and takes no sibling's name (in any case); a parent that sets maxapplications needs
    it on every child; the new max fits the max above it; the bounds on resources, depth and
    size. Placement rules name queues by path, so a partition with any is left to the whole
    check, as is a new queue without a limit to set or with a problem: the whole check reports
    every problem.
    """
    part = index.partitions.get(partition)
    wanted = {r: v for r, v in limits.items() if v is not None}
    if part is None or part.placement or not wanted or queue in part.queues:
        return None
    segments = queue.split(".")
    known = 1
    while ".".join(segments[: known + 1]) in part.queues:
        known += 1
    parent = ".".join(segments[:known])
    missing = segments[known:]
    if part.queues[parent].max_applications or _name_key(parent, missing[0]) in part.names:
        return None
    if not all(QUEUE_NAME.fullmatch(name) for name in missing):
        return None
    leaf = _leaf_facts(queue, len(segments), wanted)
    if not fit_in_max_undef(_max_above(part.queues, queue, known), leaf.maximum):
        return None
    try:
        bounds.limit_set(leaf.max_text)
        bounds.partition(_uses_after(part.uses, None, leaf), part.name)
    except InvalidRequest:
        return None
    subtree = _subtree(missing, leaf)
    if validation.document_problem(subtree, validation.MAX_DEPTH - _ROOT_DEPTH - 2 * known + 1):
        return None
    if index.values + _added_values(part, parent, subtree) > validation.MAX_NODES:
        return None
    created = tuple(".".join(segments[:end]) for end in range(known + 1, len(segments) + 1))
    return NewQueue(partition, queue, parent, created, wanted)


def _leaf_facts(queue: str, level: int, limits: Mapping[str, int]) -> QueueFacts:
    resources: dict[str, Any] = {}
    set_max_resources(resources, limits)
    return QueueFacts(queue, level, resources, {}, _parsed(resources.get("max")), (), ())


def _subtree(missing: list[str], leaf: QueueFacts) -> dict[str, Any]:
    """The nodes added to the document, as the whole path adds them (see
    :func:`~quota_ledger.config.queue_max.queue_node`)."""
    node: dict[str, Any] = {"name": missing[-1], "resources": copy.deepcopy(dict(leaf.resources or {}))}
    for name in reversed(missing[:-1]):
        node = {"name": name, "queues": [node]}
    return node


def _added_values(part: PartitionIndex, parent: str, subtree: Mapping[str, Any]) -> int:
    """How many values the document gains: the subtree, and a queue list where there was none."""
    return count_values(subtree) + (0 if part.queues[parent].children else 1)


def advanced(
    index: ConfigIndex, version: int, partition: str, queue: str, limits: Mapping[str, int | None]
) -> ConfigIndex:
    """The index of the next version, in which ``queue``'s max got ``limits`` (root's limits
    are not in the document: only the version moves). A queue not configured yet is added with
    the levels missing above it, as replaying the change adds them."""
    if queue == ROOT:
        return replace(index, version=version)
    part = index.partitions[partition]
    if queue not in part.queues:
        return _added(index, version, part, queue, limits)
    old = part.queues[queue]
    new = _next_facts(old, limits)
    moved = replace(
        part, queues=layered.updated(part.queues, {queue: new}), uses=_uses_after(part.uses, old, new)
    )
    return ConfigIndex(version, {**index.partitions, partition: moved}, _values_after(index, old, new))


def _added(
    index: ConfigIndex, version: int, part: PartitionIndex, queue: str, limits: Mapping[str, int | None]
) -> ConfigIndex:
    segments = queue.split(".")
    known = 1
    while ".".join(segments[: known + 1]) in part.queues:
        known += 1
    parent = ".".join(segments[:known])
    leaf = _leaf_facts(queue, len(segments), {r: v for r, v in limits.items() if v is not None})
    if not leaf.resources:
        leaf = replace(leaf, resources=None)
    values = index.values + _added_values(part, parent, _subtree(segments[known:], leaf))
    if not leaf.resources:
        values -= 1  # no resources mapping: the whole path drops an empty one
    queues: dict[str, QueueFacts] = {}
    names: dict[str, str] = {}
    above = part.queues[parent]
    for end in range(known + 1, len(segments) + 1):
        path = ".".join(segments[:end])
        queues[above.path] = replace(above, children=layered.appended(above.children, path))
        names[_name_key(above.path, segments[end - 1])] = path
        above = leaf if end == len(segments) else QueueFacts(path, end, None, {}, {}, (), ())
    queues[queue] = leaf
    moved = replace(
        part,
        queues=layered.updated(part.queues, queues),
        uses=_uses_after(part.uses, None, leaf),
        names=layered.updated(part.names, names),
    )
    return ConfigIndex(version, {**index.partitions, part.name: moved}, values)
