"""Kubernetes namespaces placed on queues, as YuniKorn's shim and ``tag`` placement rule do.

A namespace ``ns`` lands on ``root.ns``, or on ``<parent>.ns`` when annotated with
``yunikorn.apache.org/parentqueue`` (a name without ``root.`` is qualified). Its queue's max comes
from ``yunikorn.apache.org/namespace.quota`` (JSON of Kubernetes quantities: ``cpu`` becomes
``vcore`` milli-cores, ``memory`` bytes, anything else a count) or, when that is absent, the
deprecated ``namespace.max.cpu`` / ``namespace.max.memory``. Pure: parsing only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quota_ledger.model import queues, validation
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.quantity import parse_quantity, validate_resource_name

PARENT = "yunikorn.apache.org/parentqueue"
QUOTA = "yunikorn.apache.org/namespace.quota"
MAX_CPU = "yunikorn.apache.org/namespace.max.cpu"
MAX_MEMORY = "yunikorn.apache.org/namespace.max.memory"


@dataclass(frozen=True, slots=True)
class Placement:
    namespace: str
    queue: str
    #: the queue's max in ledger base units; None when no quota annotation is set
    max: Mapping[str, int] | None


def placement(manifest: Any) -> Placement:
    doc = _document(manifest)
    if doc.get("kind", "Namespace") != "Namespace":
        raise InvalidRequest(f"expected a Namespace, not {doc.get('kind')!r}", field="kind")
    metadata = doc.get("metadata")
    if not isinstance(metadata, Mapping):
        raise InvalidRequest("a Namespace needs metadata", field="metadata")
    name = validation.namespace(metadata.get("name"), "metadata.name")
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, Mapping) or not all(isinstance(v, str) for v in annotations.values()):
        raise InvalidRequest("annotations must map names to strings", field="metadata.annotations")
    parent = "root"
    if (given := annotations.get(PARENT, "").strip()) != "":
        parent = given if given == "root" or given.startswith("root.") else f"root.{given}"
        try:
            queues.validate_queue(parent)
        except InvalidRequest as error:
            raise InvalidRequest(f"invalid parent queue {given!r}: {error}", field=PARENT) from error
    return Placement(name, f"{parent}.{name}", _max(annotations))


def _max(annotations: Mapping[str, str]) -> dict[str, int] | None:
    if QUOTA in annotations:
        try:
            quota = json.loads(annotations[QUOTA])
        except ValueError as error:
            raise InvalidRequest(f"{QUOTA} is not JSON: {error}", field=QUOTA) from error
        if not isinstance(quota, dict) or not all(isinstance(v, str | int) for v in quota.values()):
            raise InvalidRequest(f"{QUOTA} must be a JSON object of quantities", field=QUOTA)
        return {_resource(k): parse_quantity(k, str(v)) for k, v in quota.items()}
    found = {}
    if MAX_CPU in annotations:
        found["vcore"] = parse_quantity("cpu", annotations[MAX_CPU])
    if MAX_MEMORY in annotations:
        found["memory"] = parse_quantity("memory", annotations[MAX_MEMORY])
    return found or None


def _resource(name: str) -> str:
    validate_resource_name(name)
    return "vcore" if name == "cpu" else name


def _document(manifest: Any) -> Mapping[str, Any]:
    manifest = validation.manifest(manifest, "manifest")
    if not isinstance(manifest, Mapping):
        raise InvalidRequest("a Namespace manifest must be a mapping", field="manifest")
    return manifest
