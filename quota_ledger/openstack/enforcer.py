"""``quota_ledger.openstack.Enforcer``: oslo.limit's ``Enforcer``, with the ledger counting.

A service swaps ``from oslo_limit import limit`` / ``limit.Enforcer(usage_callback)`` for
``quota_ledger.openstack.Enforcer(...)`` and keeps its calls: :meth:`Enforcer.enforce` raises
``oslo_limit.exception.ProjectOverLimit`` with one ``OverLimitInfo`` per broken limit,
:meth:`~Enforcer.calculate_usage`, :meth:`~Enforcer.get_project_limits` and
:meth:`~Enforcer.get_registered_limits` answer as oslo.limit's do. Two modes:

- ``Enforcer(usage_callback)``: the service counts its own resources, as with oslo.limit; a
  check is only a check, and requests checked at the same time may together pass a limit
  (the racy mode). Flat model only, like oslo.limit.
- ``Enforcer(None, ledger=url_or_engine)``: the ledger counts. :meth:`Enforcer.claim` reserves
  atomically (check and count in one step), commits when its block ends and rolls back when
  it raises; a crashed process's reservation expires after its ttl. Both of Keystone's models,
  ``strict_two_level`` included (a domain's limit holds for its projects together).

Limits come from a :class:`~quota_ledger.openstack.sources.LimitSource`: by default
:class:`~quota_ledger.openstack.sources.OsloLimitSource` (Keystone through the ``[oslo_limit]``
options, or oslo.limit's ``LimitFixture``); each project's queues are written into the ledger
through :func:`~quota_ledger.openstack.unified_limits.owned_queues` when the enforcer first meets it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta

from oslo_limit.exception import OverLimitInfo, ProjectOverLimit
from oslo_limit.limit import ProjectUsage
from sqlalchemy.engine import URL

from quota_ledger.engine import QuotaEngine
from quota_ledger.model.errors import OverQuota
from quota_ledger.openstack import oslo_lookup
from quota_ledger.openstack.claims import Claim
from quota_ledger.openstack.oslo_lookup import Scope, Units
from quota_ledger.openstack.project_queues import KnownLimits, Placed
from quota_ledger.openstack.sources import LimitSource, OsloLimitSource
from quota_ledger.openstack.unified_limits import EnforcementModel, Selection, queue_path

#: oslo.limit's ``usage_callback``: (project_id or None, resource names) -> {name: usage}
UsageCallback = Callable[[str | None, Collection[str]], Mapping[str, int]]


def _check_project(project_id: object) -> None:
    if project_id is not None and (not project_id or not isinstance(project_id, str)):
        raise ValueError("project_id must be a non-empty string or None.")


def _check_deltas(deltas: object) -> None:
    if not isinstance(deltas, dict) or len(deltas) == 0:
        raise ValueError("deltas must be a non-empty dictionary.")
    for name, value in deltas.items():
        if not isinstance(name, str):
            raise ValueError("resource name is not a string.")
        if not isinstance(value, int):
            raise ValueError("resource limit is not an integer.")


def _check_names(names: object) -> list[str]:
    message = "resources_to_check must be non-empty sequence of resource name strings"
    try:
        listed: list[str] = list(names)  # type: ignore[call-overload]
    except TypeError:
        raise ValueError(message) from None
    if not listed or not all(isinstance(n, str) for n in listed):
        raise ValueError(message)
    return listed


class Enforcer:
    """Checks (and with the ledger, claims) usage against Keystone's limits; see the module."""

    def __init__(
        self,
        usage_callback: UsageCallback | None,
        cache: bool = True,
        *,
        ledger: QuotaEngine | str | URL | None = None,
        limits: LimitSource | None = None,
        selection: Selection | None = None,
        ttl: float | timedelta | None = None,
    ) -> None:
        """``usage_callback`` as oslo.limit's (the racy mode), or None with ``ledger`` (a
        :class:`QuotaEngine`, or a database URL for one this enforcer opens, migrates and
        closes). ``cache`` keeps the limits read for the enforcer's lifetime, as oslo.limit's
        does. ``limits``: where they are read (default: as oslo.limit reads them);
        ``selection``: which services, region and partition, and what a missing registered
        limit means (default: refused, as oslo.limit counts it). ``ttl``: how long a claim is
        held when its process dies before it ends (default: the engine's)."""
        if usage_callback is not None and not callable(usage_callback):
            raise ValueError("usage_callback must be a callable function.")
        if (usage_callback is None) == (ledger is None):
            raise ValueError(
                "give either a usage_callback (the service counts) or ledger= (the ledger counts)"
            )
        self._usage_callback = usage_callback
        self._known = KnownLimits(limits if limits is not None else OsloLimitSource(), cache=cache)
        self.selection = selection or Selection()
        self.ttl = ttl
        self._placed = Placed()
        # The model is read first, as oslo.limit's enforcer reads it: an enforcer that cannot
        # read its limits opens no engine.
        self.model: EnforcementModel = self._known.registered().model
        if usage_callback is not None and self.model is not EnforcementModel.FLAT:
            raise ValueError("the strict_two_level model needs the ledger to count usage: pass ledger=")
        self._owns_engine = False
        self.engine: QuotaEngine | None = None
        if isinstance(ledger, QuotaEngine):
            self.engine = ledger
        elif ledger is not None:
            self.engine = QuotaEngine.from_url(ledger)
            self._owns_engine = True
            try:
                self.engine.migrate()
            except BaseException:
                self.engine.close()
                raise

    def close(self) -> None:
        """Close the engine this enforcer opened from a URL (an engine given stays open)."""
        if self._owns_engine and self.engine is not None:
            self.engine.close()

    def __enter__(self) -> Enforcer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- oslo.limit's calls --------------------------------------------------------------------

    def enforce(self, project_id: str | None, deltas: dict[str, int]) -> None:
        """Raise ``ProjectOverLimit`` when ``current usage + delta`` passes a limit of a
        resource in ``deltas`` (a delta of 0 checks current usage), listing every such limit,
        by resource name; under ``strict_two_level`` a project's own limit, then its domain's.
        Only a check: nothing is counted (see :meth:`claim`)."""
        _check_project(project_id)
        _check_deltas(deltas)
        scopes, usage = self._read(project_id, list(deltas))
        over = oslo_lookup.over_limits(scopes, usage, deltas)
        if over:
            raise ProjectOverLimit(project_id, over)

    def calculate_usage(
        self, project_id: str | None, resources_to_check: Collection[str]
    ) -> dict[str, ProjectUsage]:
        """``{name: ProjectUsage(limit, usage)}``: the limit as :meth:`get_project_limits`
        answers it, and the usage of the project (its own queue)."""
        _check_project(project_id)
        names = _check_names(resources_to_check)
        scopes, usage = self._read(project_id, names)
        limits = dict(self.get_project_limits(project_id, names))
        own = usage[scopes[0].queue]
        return {name: ProjectUsage(limits[name], own.get(name, 0)) for name in names}

    def get_registered_limits(self, resources_to_check: Collection[str] | None) -> list[tuple[str, int]]:
        """``[(name, default)]``, 0 for a name nothing registers; every registered one for None."""
        limits = self._known.registered()
        if resources_to_check is None:
            return [(r.resource_name, r.default_limit) for r in limits.registered]
        return [
            (name, oslo_lookup.registered_limit(limits, self.selection, name) or 0)
            for name in resources_to_check
        ]

    def get_project_limits(
        self, project_id: str | None, resources_to_check: Collection[str] | None
    ) -> list[tuple[str, int]]:
        """``[(name, limit)]``: the project's own limit, else the registered default, else 0
        (for None: the project's own limits only)."""
        if project_id is None:
            if resources_to_check is None:
                raise ValueError("project_id must not be None")
            return self.get_registered_limits(resources_to_check)
        limits, _ = self._known.project(project_id)
        if resources_to_check is None:
            return oslo_lookup.own_limits(limits, self.selection, project_id)
        return [
            (name, oslo_lookup.project_limit(limits, self.selection, project_id, name))
            for name in resources_to_check
        ]

    # -- with the ledger -----------------------------------------------------------------------

    @contextmanager
    def claim(
        self,
        project_id: str,
        deltas: dict[str, int],
        *,
        key: str | None = None,
        ttl: float | timedelta | None = None,
    ) -> Iterator[Claim]:
        """Reserve ``deltas`` for ``project_id`` in one atomic step, or raise
        ``ProjectOverLimit`` as :meth:`enforce` would. Leaving the block commits what is still
        held (the block may commit or roll back the :class:`Claim` itself); an exception in it
        rolls it back (and is raised again); if the process dies, the reservation expires after
        ``ttl``. ``key`` (the request's id) makes a retry return the same claim, in the state
        it has reached (:attr:`Claim.state`: a retry of a request that finished finds it
        committed or rolled back, and leaving the block then changes nothing)."""
        held = self.reserve(project_id, deltas, key=key, ttl=ttl)
        try:
            yield held
        except BaseException as error:
            held.abandon(error)
            raise
        held.close()

    def reserve(
        self,
        project_id: str,
        deltas: dict[str, int],
        *,
        key: str | None = None,
        ttl: float | timedelta | None = None,
    ) -> Claim:
        """:meth:`claim` without the block: the :class:`Claim` is committed or rolled back by
        the caller (perhaps in another process, by its id), or expires."""
        engine = self._ledger()
        if project_id is None:
            raise ValueError("the ledger counts per project: project_id must be a non-empty string")
        _check_project(project_id)
        _check_deltas(deltas)
        if any(value < 0 for value in deltas.values()):
            raise ValueError("a claim's deltas must not be negative (release what is gone)")
        limits, project = self._known.project(project_id)
        self._placed.place(engine, limits, self.selection, project)
        names = list(deltas)
        scopes = oslo_lookup.scopes(limits, self.selection, project, names)
        units = {name: oslo_lookup.units_of(limits, self.selection, name) for name in names}
        # What the ledger cannot refuse by itself: a delta of 0 over a limit already passed, and
        # a resource nothing registers (no limit in the ledger, 0 in oslo.limit's reading).
        unguarded = [
            n for n in names if deltas[n] == 0 or not oslo_lookup.mentioned(limits, self.selection, n)
        ]
        if unguarded:
            usage = self._ledger_usage(scopes, units)
            if oslo_lookup.over_limits(scopes, usage, {n: deltas[n] for n in unguarded}):
                raise ProjectOverLimit(project_id, oslo_lookup.over_limits(scopes, usage, deltas))
        wanted = {units[n].resource.name: units[n].to_ledger(v) for n, v in deltas.items() if v > 0}
        if not wanted:
            raise ValueError("a claim needs a positive delta (enforce() checks current usage)")
        try:
            reservation = engine.reserve(
                scopes[0].queue,
                wanted,
                partition=self.selection.partition,
                key=key,
                ttl=ttl if ttl is not None else self.ttl,
            )
        except OverQuota as refused:
            raise ProjectOverLimit(project_id, _over_limit_info(refused, units, deltas)) from refused
        held = Claim(engine, reservation, project_id, dict(deltas))
        if any(warning.startswith(f"`{scopes[0].queue}` ") for warning in reservation.warnings):
            # The project's queue was gone (a sync that read Keystone before the project existed
            # replaced the owned queues), so no limit of it decided: put it back, then check
            # again with this claim counted, as a service's recheck does.
            self._placed.forget(project.id)
            self._placed.place(engine, limits, self.selection, project)
            usage = self._ledger_usage(scopes, units)
            if oslo_lookup.over_limits(scopes, usage, dict.fromkeys(deltas, 0)):
                held.rollback()
                raise ProjectOverLimit(
                    project_id, oslo_lookup.over_limits(scopes, self._ledger_usage(scopes, units), deltas)
                )
        return held

    def release(self, project_id: str, deltas: dict[str, int], *, key: str | None = None) -> None:
        """Count ``deltas`` of the project's resources as gone (a deleted server, a detached
        accelerator). With ``key``, a retry releases once."""
        engine = self._ledger()
        _check_project(project_id)
        _check_deltas(deltas)
        limits, project = self._known.project(project_id)
        amounts = {}
        for name, value in deltas.items():
            units = oslo_lookup.units_of(limits, self.selection, name)
            amounts[units.resource.name] = units.to_ledger(value)
        engine.release(
            queue_path(limits.model, project), amounts, partition=self.selection.partition, key=key
        )

    # -- internals -----------------------------------------------------------------------------

    def _ledger(self) -> QuotaEngine:
        if self.engine is None:
            raise ValueError("claims need the ledger to count usage: construct the enforcer with ledger=")
        return self.engine

    def _read(
        self, project_id: str | None, names: list[str]
    ) -> tuple[list[Scope], dict[str, dict[str, int]]]:
        """The scopes of ``names`` for the project, and their current usage (Keystone units)."""
        if project_id is None:
            if self.engine is not None:
                raise ValueError("the ledger counts per project: project_id must be a non-empty string")
            limits = self._known.registered()
            scope = Scope(
                queue="", limits={n: oslo_lookup.default_limit(limits, self.selection, n) for n in names}
            )
            return [scope], {"": self._callback(None, names)}
        limits, project = self._known.project(project_id)
        scopes = oslo_lookup.scopes(limits, self.selection, project, names)
        if self.engine is None:
            return scopes, {scopes[0].queue: self._callback(project_id, names)}
        self._placed.place(self.engine, limits, self.selection, project)
        units = {name: oslo_lookup.units_of(limits, self.selection, name) for name in names}
        return scopes, self._ledger_usage(scopes, units)

    def _callback(self, project_id: str | None, names: list[str]) -> dict[str, int]:
        assert self._usage_callback is not None
        found = self._usage_callback(project_id, sorted(names))
        missing = [n for n in names if n not in found]
        if missing:
            raise ValueError(f"unable to get current usage for {missing[0]}")
        return {n: int(found[n]) for n in names}

    def _ledger_usage(self, scopes: list[Scope], units: Mapping[str, Units]) -> dict[str, dict[str, int]]:
        assert self.engine is not None
        found: dict[str, dict[str, int]] = {}
        for scope in scopes:
            counted = self.engine.usage(scope.queue, partition=self.selection.partition)
            found[scope.queue] = {}
            for name, unit in units.items():
                usage = counted.get(unit.resource.name)
                found[scope.queue][name] = (
                    0 if usage is None else unit.from_ledger(usage.in_use + usage.reserved)
                )
        return found


def _over_limit_info(
    refused: OverQuota, units: Mapping[str, Units], deltas: Mapping[str, int]
) -> list[OverLimitInfo]:
    """The ledger's violations in oslo.limit's terms, by resource name, the project's own first."""
    names = {unit.resource.name: name for name, unit in units.items()}
    found = []
    for violation in refused.violations:
        name = names.get(violation.resource, violation.resource)
        unit = units.get(name)
        if unit is None:
            continue
        current = unit.from_ledger(violation.in_use + violation.reserved)
        found.append(
            (name, -violation.scope.count("."), unit.from_ledger(violation.limit), current, deltas[name])
        )
    return [OverLimitInfo(name, limit, current, delta) for name, _, limit, current, delta in sorted(found)]
