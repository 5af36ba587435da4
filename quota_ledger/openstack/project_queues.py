"""The Keystone view an enforcer works from, and its projects' queues in the ledger.

:class:`KnownLimits` reads a source once (or at every use without ``cache``) and looks up a
project it has not seen on demand. :func:`place` writes one project's queues (its own, and
under ``strict_two_level`` its domain's) into the ledger's configuration as
:func:`~quota_ledger.openstack.unified_limits.owned_queues` maps them, leaving every other queue as it
is: an enforcer adds the projects it meets one by one, and enforcers of other processes add
theirs at the same time without removing each other's (each addition is one
:meth:`~quota_ledger.engine.QuotaEngine.edit_config`, under the configuration's lock).
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from quota_ledger.config.model import ROOT
from quota_ledger.engine import QuotaEngine
from quota_ledger.openstack.sources import LimitSource
from quota_ledger.openstack.unified_limits import (
    EnforcementModel,
    KeystoneLimits,
    MappingProblem,
    Project,
    Selection,
    is_owned,
    owned_queues,
)


class KnownLimits:
    """Keystone's limits as far as an enforcer has met its projects; thread-safe."""

    def __init__(self, source: LimitSource, *, cache: bool = True) -> None:
        self.source = source
        self.cache = cache
        self._limits: KeystoneLimits | None = None
        self._lock = threading.Lock()

    def project(self, project_id: str) -> tuple[KeystoneLimits, Project]:
        """The limits, with ``project_id`` among their projects. Raises ValueError when Keystone
        has no such project and its model needs to know the project's domain."""
        with self._lock:
            limits = self._limits if self.cache and self._limits is not None else self.source.read()[0]
            found = next((p for p in limits.projects if p.id == project_id), None)
            if found is None:
                looked_up = self.source.project(project_id)
                if looked_up is None:
                    if limits.model is not EnforcementModel.FLAT:
                        raise ValueError(f"Keystone has no project {project_id}")
                    looked_up = (Project(id=project_id, domain_id="default"), ())
                found, own = looked_up
                limits = replace(
                    limits,
                    projects=(*limits.projects, found),
                    project_limits=(*limits.project_limits, *own),
                )
            self._limits = limits
            return limits, found

    def registered(self) -> KeystoneLimits:
        """The limits without asking for a project (the registered ones are all there)."""
        with self._lock:
            if not self.cache or self._limits is None:
                self._limits = self.source.read()[0]
            return self._limits


def upsert(
    document: Mapping[str, Any], queues: Sequence[Mapping[str, Any]], *, partition: str
) -> dict[str, Any]:
    """``document`` with ``queues`` (Keystone-owned queues below root) added, or put in place of
    the owned queues of the same names, and every other queue (and child) as it was. Raises
    :class:`MappingProblem` when a queue of that name is configured locally."""
    found = copy.deepcopy(dict(document))
    if set(found) == {"version", "config"}:  # the service's {"version", "config"} answer
        found = copy.deepcopy(dict(found["config"]))
    partitions: list[dict[str, Any]] = found.setdefault("partitions", [])
    part = next((p for p in partitions if (p.get("name") or "default") == partition), None)
    if part is None:
        part = {"name": partition, "queues": [{"name": ROOT}]}
        partitions.append(part)
    tops: list[dict[str, Any]] = part.setdefault("queues", [])
    root = next((q for q in tops if str(q.get("name", "")).lower() == ROOT), None)
    if root is None:
        root = {"name": ROOT}
        tops.insert(0, root)
    _merge(root, queues, ROOT)
    return found


def _merge(parent: dict[str, Any], queues: Sequence[Mapping[str, Any]], path: str) -> None:
    if not queues:
        return
    children: list[dict[str, Any]] = parent.setdefault("queues", [])
    for queue in queues:
        name = queue["name"]
        existing = next((c for c in children if c.get("name") == name), None)
        if existing is None:
            children.append(copy.deepcopy(dict(queue)))
            continue
        if not is_owned(existing):
            raise MappingProblem(f"queue {path}.{name} is configured in the ledger, not by Keystone")
        for key in ("parent", "resources", "properties"):
            if key in queue:
                existing[key] = copy.deepcopy(queue[key])
            else:
                existing.pop(key, None)
        _merge(existing, queue.get("queues") or [], f"{path}.{name}")


class Placed:
    """The queues of the projects an enforcer has written, so each is written once per change."""

    def __init__(self) -> None:
        self._written: dict[str, str] = {}
        self._lock = threading.Lock()

    def forget(self, project_id: str) -> None:
        """Write ``project_id``'s queues again next time (they were found missing)."""
        with self._lock:
            self._written.pop(project_id, None)

    def place(
        self, engine: QuotaEngine, limits: KeystoneLimits, selection: Selection, project: Project
    ) -> None:
        """Write ``project``'s queues into ``engine``'s configuration unless they are there as
        this enforcer last wrote them."""
        queues = owned_queues(replace(limits, projects=(project,)), selection)
        text = json.dumps(queues, sort_keys=True)
        with self._lock:
            if self._written.get(project.id) == text:
                return
            engine.edit_config(lambda document: upsert(document, queues, partition=selection.partition))
            self._written[project.id] = text
