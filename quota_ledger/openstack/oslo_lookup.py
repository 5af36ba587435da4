"""A project's limits in Keystone's terms, as oslo.limit looks them up, and oslo.limit's rule for
what is over them. Pure; no I/O.

oslo.limit answers a project's limit of a resource with the project's own limit, else the
registered default, else 0 (a resource nobody registered is refused). ``-1`` is unlimited.
Under ``strict_two_level`` a project counts against two queues: its own (its limit capped by
its domain's, as :mod:`quota_ledger.openstack.unified_limits` maps it) and its domain's, whose limit
holds for all of the domain's projects together. Each is a :class:`Scope`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from oslo_limit.exception import OverLimitInfo

from quota_ledger.config.model import ROOT
from quota_ledger.model.quantity import parse_quantity
from quota_ledger.openstack.unified_limits import (
    UNLIMITED,
    DomainLimit,
    EnforcementModel,
    KeystoneLimits,
    MissingRegistered,
    Project,
    ProjectLimit,
    RegisteredLimit,
    Resource,
    Selection,
    ledger_resource,
    queue_path,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Scope:
    """One ledger queue a project's requests count against, with its limits (Keystone names and
    units; -1 unlimited)."""

    queue: str
    limits: Mapping[str, int]


def _applies(record: RegisteredLimit | ProjectLimit | DomainLimit, selection: Selection) -> bool:
    """The selection's rule (see :class:`Selection`): its services, its region or none."""
    if selection.service_ids is not None and record.service_id not in selection.service_ids:
        return False
    return record.region_id is None or record.region_id == selection.region_id


def _chosen(records: Iterable[tuple[int, str | None]]) -> int | None:
    """The value of the region's own record over one of no region; None when there is none."""
    found: tuple[int, bool] | None = None
    for value, region in records:
        if found is None or (region is not None and not found[1]):
            found = (value, region is not None)
    return None if found is None else found[0]


def registered_limit(limits: KeystoneLimits, selection: Selection, name: str) -> int | None:
    """The registered default of ``name``, or None when nothing registers it."""
    return _chosen(
        (r.default_limit, r.region_id)
        for r in limits.registered
        if r.resource_name == name and _applies(r, selection)
    )


def default_limit(limits: KeystoneLimits, selection: Selection, name: str) -> int:
    """What a project without a limit of its own gets: the registered default, else 0 (or -1
    when the selection counts a missing registered limit as unlimited)."""
    found = registered_limit(limits, selection, name)
    if found is not None:
        return found
    return 0 if selection.missing is MissingRegistered.ZERO else UNLIMITED


def project_limit(limits: KeystoneLimits, selection: Selection, project_id: str, name: str) -> int:
    """oslo.limit's answer: the project's own limit, else the default."""
    own = _chosen(
        (p.resource_limit, p.region_id)
        for p in limits.project_limits
        if p.project_id == project_id and p.resource_name == name and _applies(p, selection)
    )
    return default_limit(limits, selection, name) if own is None else own


def domain_limit(limits: KeystoneLimits, selection: Selection, domain_id: str, name: str) -> int:
    """A domain's limit (``strict_two_level``): its own, else the default."""
    own = _chosen(
        (d.resource_limit, d.region_id)
        for d in limits.domain_limits
        if d.domain_id == domain_id and d.resource_name == name and _applies(d, selection)
    )
    return default_limit(limits, selection, name) if own is None else own


def _records(
    limits: KeystoneLimits, selection: Selection, name: str
) -> list[RegisteredLimit | ProjectLimit | DomainLimit]:
    every: list[RegisteredLimit | ProjectLimit | DomainLimit] = [
        *limits.registered,
        *limits.project_limits,
        *limits.domain_limits,
    ]
    return [r for r in every if r.resource_name == name and _applies(r, selection)]


def mentioned(limits: KeystoneLimits, selection: Selection, name: str) -> bool:
    """Whether some limit of the selection names ``name`` (then the ledger has its limits; a
    name nothing names has none there, where oslo.limit reads 0)."""
    return bool(_records(limits, selection, name))


def units_of(limits: KeystoneLimits, selection: Selection, name: str) -> Units:
    """How ``name`` is counted in the ledger, by the type of the service whose limits name it."""
    found = _records(limits, selection, name)
    service_type = limits.services.get(found[0].service_id, "") if found else ""
    return Units.of(service_type, name)


def own_limits(limits: KeystoneLimits, selection: Selection, project_id: str) -> list[tuple[str, int]]:
    """Every limit set on the project itself, in Keystone's order (oslo.limit's answer for no
    names)."""
    own = [p for p in limits.project_limits if p.project_id == project_id and _applies(p, selection)]
    names = dict.fromkeys(p.resource_name for p in own)
    return [(name, project_limit(limits, selection, project_id, name)) for name in names]


def _capped(value: int, cap: int) -> int:
    if cap < 0:
        return value
    return cap if value < 0 else min(value, cap)


def scopes(
    limits: KeystoneLimits, selection: Selection, project: Project, names: Collection[str]
) -> list[Scope]:
    """The queues ``project``'s requests for ``names`` count against, its own first."""
    own = {name: project_limit(limits, selection, project.id, name) for name in names}
    if limits.model is EnforcementModel.FLAT:
        return [Scope(queue=queue_path(limits.model, project), limits=own)]
    cap = {name: domain_limit(limits, selection, project.domain_id, name) for name in names}
    return [
        Scope(
            queue=queue_path(limits.model, project),
            limits={name: _capped(value, cap[name]) for name, value in own.items()},
        ),
        Scope(queue=f"{ROOT}.{project.domain_id}", limits=cap),
    ]


def over_limits(
    scopes: Iterable[Scope], usage: Mapping[str, Mapping[str, int]], deltas: Mapping[str, int]
) -> list[OverLimitInfo]:
    """oslo.limit's rule on every scope: each limit (not -1) that ``usage + delta`` passes, by
    resource name, then scope. ``usage`` is queue -> resource -> current usage."""
    found = []
    listed = list(scopes)
    for name in sorted(deltas):
        for scope in listed:
            limit = scope.limits[name]
            if limit < 0:
                continue
            current = int(usage[scope.queue].get(name, 0))
            if current + int(deltas[name]) > limit:
                found.append(OverLimitInfo(name, limit, current, int(deltas[name])))
    return found


@dataclass(frozen=True, slots=True)
class Units:
    """How one Keystone resource is counted in the ledger: its name there and the size of one
    Keystone unit in the ledger's base units (a MiB of ``class:MEMORY_MB`` is 1048576 bytes)."""

    resource: Resource
    unit: int

    @classmethod
    def of(cls, service_type: str, name: str) -> Units:
        resource = ledger_resource(service_type, name)
        return cls(resource, parse_quantity(resource.name, resource.quantity(1)))

    def to_ledger(self, amount: int) -> str:
        """``amount`` Keystone units as the ledger's quantity."""
        return self.resource.quantity(amount)

    def from_ledger(self, units: int) -> int:
        """Base units of the ledger in Keystone units, a part of a unit counted as one."""
        return -(-units // self.unit)
