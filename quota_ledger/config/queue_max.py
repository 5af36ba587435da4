"""One queue's max in a stored configuration document: setting it, and replaying the changes
recorded since a whole-configuration snapshot.

``root`` has no max in YuniKorn's format (its max is the cluster size), so root limits are kept
as the partition's capacity next to the document.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from quota_ledger.config.model import partition_name

Document = dict[str, Any]
Capacity = dict[str, dict[str, int]]
ROOT = "root"


@dataclass(frozen=True, slots=True)
class LimitChange:
    """One recorded change (a row of ``quota_config_changes``): None removes the limit."""

    version: int
    partition: str
    queue: str
    resource: str
    limit: int | None


def text(resource: str, value: int) -> str:
    """How a limit is written in the document: exact base units (YuniKorn's config counts only
    vcore in milli-units)."""
    return f"{value}m" if resource == "vcore" else str(value)


def set_max_resources(resources: dict[str, Any], limits: Mapping[str, int | None]) -> None:
    """Set (or with None remove) entries of a queue's ``resources`` mapping's ``max``, in place;
    an emptied ``max`` is removed."""
    maximum = resources.setdefault("max", {})
    for resource, value in limits.items():
        if value is None:
            maximum.pop(resource, None)
        else:
            maximum[resource] = text(resource, value)
    if not maximum:
        del resources["max"]


def set_capacity(capacity: Capacity, partition: str, limits: Mapping[str, int | None]) -> None:
    """Set (or with None remove) root's limits of ``partition``, in place."""
    current = capacity.setdefault(partition, {})
    for resource, value in limits.items():
        if value is None:
            current.pop(resource, None)
        else:
            current[resource] = value
    if not current:
        del capacity[partition]


def set_queue_max(
    document: Document, capacity: Capacity, partition: str, queue: str, limits: Mapping[str, int | None]
) -> None:
    """Set (or with None remove) ``queue``'s max in ``document`` (root: in ``capacity``), in
    place; queues and the partition missing on the way are added."""
    if queue == ROOT:
        set_capacity(capacity, partition, limits)
        return
    node = queue_node(document, partition, queue)
    resources = node.setdefault("resources", {})
    set_max_resources(resources, limits)
    if not resources:
        del node["resources"]


def queue_node(document: Document, partition: str, queue: str) -> dict[str, Any]:
    """The node of ``queue`` in ``document``, added (with the partition) when missing."""
    parts = document.setdefault("partitions", [])
    found = next((p for p in parts if partition_name(p.get("name", "")) == partition), None)
    if found is None:
        found = {"name": partition, "queues": [{"name": ROOT}]}
        parts.append(found)
    node: dict[str, Any] = found
    for segment in queue.split("."):
        level: list[dict[str, Any]] = node.setdefault("queues", [])
        child = next((q for q in level if q.get("name") == segment), None)
        if child is None:
            child = {"name": segment}
            level.append(child)
        node = child
    return node


def grouped(changes: Iterable[LimitChange]) -> list[tuple[int, str, str, dict[str, int | None]]]:
    """(version, partition, queue, {resource: limit}) for each queue a version changed."""
    found: dict[tuple[int, str, str], dict[str, int | None]] = {}
    for change in changes:
        found.setdefault((change.version, change.partition, change.queue), {})[change.resource] = change.limit
    return [(v, p, q, limits) for (v, p, q), limits in sorted(found.items(), key=lambda item: item[0][0])]


def replay(
    document: Document, capacity: Capacity, changes: Iterable[LimitChange]
) -> tuple[Document, Capacity]:
    """The document and capacity of a snapshot with ``changes`` (oldest first) applied, with
    keys sorted as the stored form has them."""
    steps = grouped(changes)
    if not steps:
        return document, capacity
    for _version, partition, queue, limits in steps:
        set_queue_max(document, capacity, partition, queue, limits)
    return _sorted(document), _sorted(capacity)


def _sorted(value: Any) -> Any:
    result: Any = json.loads(json.dumps(value, sort_keys=True))
    return result
