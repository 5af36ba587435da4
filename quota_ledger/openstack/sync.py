"""Keeping the ledger's queues in step with Keystone's unified limits.

:meth:`KeystoneSync.sync_once` reads Keystone, maps what it read (:func:`.limits.owned_queues`)
and applies the configuration in force with its Keystone-owned queues replaced, as one
configuration change: a new version only when something changed. When Keystone cannot be read
it raises :class:`~.keystone.KeystoneUnreachable` (and logs it) and changes nothing, so the
limits of the last sync stay in force; :meth:`KeystoneSync.age_seconds` says how old they are.

A project created after the last sync is looked up on demand, once, by
:meth:`KeystoneSync.ensure_project`, and its queue added; the answer (found or not) is kept
until the next sync. A deleted project's queue leaves the configuration at the next sync: what
it still holds stays counted above it, nothing is evicted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from quota_ledger.config.model import DEFAULT_PARTITION
from quota_ledger.engine import QuotaEngine
from quota_ledger.model.errors import InvalidRequest, QuotaLedgerError
from quota_ledger.openstack.unified_limits import (
    KeystoneLimits,
    MissingRegistered,
    Project,
    ProjectLimit,
    Selection,
    merged,
    owned_queues,
    queue_path,
)

log = logging.getLogger("quota_ledger.openstack")


class LimitsSource(Protocol):
    """What the sync reads: :class:`~.keystone.KeystoneReader` is one."""

    def read(self) -> tuple[KeystoneLimits, dict[str, tuple[str, str]]]: ...

    def project(self, project_id: str) -> tuple[Project, tuple[ProjectLimit, ...]] | None: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncOptions:
    """Which limits a sync applies, and how."""

    #: services by id, name or type (``compute``, ``nova``); empty: every service
    services: tuple[str, ...] = ()
    #: the region whose limits apply with the limits of no region (None: those of no region)
    region: str | None = None
    #: what a resource with no registered limit means for a project without its own limit
    missing: MissingRegistered = MissingRegistered.ZERO
    partition: str = DEFAULT_PARTITION


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncResult:
    """What one sync did."""

    #: the configuration version in force after it
    version: int
    #: whether it made that version (False: Keystone's limits were already in force)
    changed: bool
    projects: int
    #: the paths of the projects' queues
    queues: tuple[str, ...]
    at: datetime


def _service_ids(wanted: Sequence[str], services: dict[str, tuple[str, str]]) -> frozenset[str] | None:
    if not wanted:
        return None
    ids = set()
    for name in wanted:
        found = {sid for sid, (kind, label) in services.items() if name in (sid, kind, label)}
        if not found:
            known = ", ".join(sorted({label or kind for kind, label in services.values()})) or "none"
            raise InvalidRequest(
                f"Keystone's catalog has no service {name!r} (known: {known})", field="service"
            )
        ids |= found
    return frozenset(ids)


class KeystoneSync:
    """Applies Keystone's limits to ``engine``; one sync or lookup at a time (thread-safe)."""

    def __init__(
        self,
        engine: QuotaEngine,
        source: LimitsSource,
        options: SyncOptions | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.source = source
        self.options = options or SyncOptions()
        self._clock = clock
        self._lock = threading.RLock()
        self._limits: KeystoneLimits | None = None
        self._selection: Selection | None = None
        self._synced_at: float | None = None
        self._looked_up: dict[str, str | None] = {}
        #: syncs that failed since the last one that succeeded
        self.failures = 0
        #: wall-clock time of the last sync that succeeded
        self.last_success: datetime | None = None

    def age_seconds(self) -> float | None:
        """Seconds since the limits in force were last read from Keystone (None: not yet)."""
        with self._lock:
            return None if self._synced_at is None else self._clock() - self._synced_at

    def sync_once(self) -> SyncResult:
        """Read Keystone and apply its limits; raises (and logs) when Keystone cannot be read,
        changing nothing."""
        with self._lock:
            try:
                limits, services = self.source.read()
                selection = Selection(
                    service_ids=_service_ids(self.options.services, services),
                    region_id=self.options.region,
                    missing=self.options.missing,
                    partition=self.options.partition,
                )
                result = self._apply(limits, selection)
            except QuotaLedgerError as exc:
                self.failures += 1
                age = self.age_seconds()
                log.warning(
                    "Keystone sync failed (%s: %s); the limits in force stay (%s)",
                    type(exc).__name__,
                    exc,
                    "never synced" if age is None else f"synced {age:.0f} s ago",
                )
                raise
            self._limits, self._selection = limits, selection
            self._synced_at = self._clock()
            self._looked_up.clear()
            self.failures = 0
            self.last_success = result.at
            log.info(
                "Keystone sync: %d projects, configuration version %d%s",
                result.projects,
                result.version,
                "" if result.changed else " (unchanged)",
            )
            return result

    def _apply(self, limits: KeystoneLimits, selection: Selection) -> SyncResult:
        owned = owned_queues(limits, selection)
        before = self.engine.config_version()
        # Under the configuration's lock: a change made meanwhile elsewhere is kept, not undone.
        version = self.engine.edit_config(
            lambda document: merged(document, owned, partition=selection.partition)
        )
        return SyncResult(
            version=version,
            changed=version != before,
            projects=len(limits.projects),
            queues=tuple(sorted(queue_path(limits.model, p) for p in limits.projects)),
            at=datetime.now(UTC),
        )

    def ensure_project(self, project_id: str) -> str | None:
        """The queue of ``project_id``, looking the project up in Keystone (once until the next
        sync) when the last sync did not know it and adding its queue; None when Keystone has no
        such project. Raises :class:`~.keystone.KeystoneUnreachable` (nothing cached) when
        Keystone cannot be read."""
        with self._lock:
            if self._limits is None or self._selection is None:
                self.sync_once()
            limits, selection = self._limits, self._selection
            assert limits is not None
            assert selection is not None
            for project in limits.projects:
                if project.id == project_id:
                    return queue_path(limits.model, project)
            if project_id in self._looked_up:
                return self._looked_up[project_id]
            found = self.source.project(project_id)
            if found is None:
                self._looked_up[project_id] = None
                return None
            project, own = found
            grown = replace(
                limits,
                projects=(*limits.projects, project),
                project_limits=(*limits.project_limits, *own),
            )
            self._apply(grown, selection)
            self._limits = grown
            path = queue_path(limits.model, project)
            self._looked_up[project_id] = path
            log.info("Keystone project %s looked up on demand: queue %s", project_id, path)
            return path

    def run(self, stop: threading.Event, *, every: float) -> None:
        """Sync every ``every`` seconds until ``stop`` is set; a failed sync is logged and the
        loop goes on."""
        while not stop.is_set():
            try:
                self.sync_once()
            except QuotaLedgerError:
                pass  # logged by sync_once; the limits in force stay
            except Exception:
                log.exception("Keystone sync failed unexpectedly")
            stop.wait(every)
