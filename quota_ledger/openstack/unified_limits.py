"""What Keystone's unified limits say, and the ledger queues they become. Pure; no I/O.

Keystone keeps, per service (and optionally region), *registered limits* (the default of a
resource for every project) and *limits* (one project's or one domain's own). Its enforcement
model decides what a hierarchy means:

- ``flat``: every project stands alone. Project ``p`` becomes the queue ``root.<p>``; domain
  limits are ignored.
- ``strict_two_level``: a domain caps the total of its projects. Project ``p`` of domain ``d``
  becomes ``root.<d>.<p>``; the domain queue's max is the domain's limit (else the registered
  default), and a project's max is its own limit (else the default) capped by its domain's, as
  a child's max may not pass its parent's. The ledger enforces maxima recursively, so the
  domain's max holds for its projects together.

``-1`` means unlimited (no max for that resource). A resource some project has a limit for but
no registered limit covers is, for the projects without a limit of their own, refused (max 0,
as oslo.limit counts a missing limit) or unlimited, as :class:`MissingRegistered` says.

Keystone's resource names become the ledger's through :data:`RESOURCE_MAPS` (per service type):
``class:VCPU`` is ``vcore`` (cores; the ledger counts milli-cores), ``class:MEMORY_MB`` is
``memory`` (MiB; the ledger counts bytes), ``class:DISK_GB`` is ``ephemeral-storage`` (GiB),
``servers`` and ``accelerators`` count objects. A name no map knows keeps its spelling with
``:`` as ``/`` (``class:CUSTOM_FPGA`` is ``class/CUSTOM_FPGA``) and counts units.

Every queue made here carries the property :data:`MANAGED_BY` = ``keystone``: the ledger refuses
a local ``set_limits`` on it (or below it), and the next mapping replaces exactly those queues
(:func:`merged`), leaving every other queue of the configuration alone.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quota_ledger.config.model import DEFAULT_PARTITION, MANAGED_BY, ROOT
from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidRequest

#: the value of :data:`MANAGED_BY` on the queues the Keystone sync owns
KEYSTONE = "keystone"
UNLIMITED = -1


class EnforcementModel(enum.Enum):
    """Keystone's ``[unified_limit] enforcement_model`` (``GET /v3/limits/model``)."""

    FLAT = "flat"
    STRICT_TWO_LEVEL = "strict_two_level"


class MissingRegistered(enum.Enum):
    """What a resource with no registered limit means for a project without a limit of its own."""

    #: refused: max 0, as oslo.limit counts a missing limit
    ZERO = "zero"
    #: no max
    UNLIMITED = "unlimited"


@dataclass(frozen=True, kw_only=True, slots=True)
class RegisteredLimit:
    """A resource's default limit for every project of a service (and region, when set)."""

    service_id: str
    region_id: str | None = None
    resource_name: str
    default_limit: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectLimit:
    """One project's own limit of a resource."""

    project_id: str
    service_id: str
    region_id: str | None = None
    resource_name: str
    resource_limit: int


@dataclass(frozen=True, kw_only=True, slots=True)
class DomainLimit:
    """One domain's limit of a resource (a Keystone limit with ``domain_id``)."""

    domain_id: str
    service_id: str
    region_id: str | None = None
    resource_name: str
    resource_limit: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Project:
    """A Keystone project (not a domain)."""

    id: str
    domain_id: str
    name: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class KeystoneLimits:
    """Everything one read of Keystone returned."""

    model: EnforcementModel
    registered: tuple[RegisteredLimit, ...] = ()
    project_limits: tuple[ProjectLimit, ...] = ()
    domain_limits: tuple[DomainLimit, ...] = ()
    projects: tuple[Project, ...] = ()
    #: service id -> service type (``compute``, ``accelerator``, ``block-storage``...)
    services: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class Resource:
    """How one Keystone resource name is counted in the ledger."""

    #: the ledger's resource name
    name: str
    #: the quantity suffix of one Keystone unit (``Mi`` for MiB); "" for plain counts
    suffix: str = ""

    def quantity(self, amount: int) -> str:
        """``amount`` Keystone units as a quantity text, for a configuration or a reservation."""
        return f"{amount}{self.suffix}" if amount else "0"


_COMPUTE = {
    "class:VCPU": Resource(name="vcore"),
    "class:PCPU": Resource(name="pcore"),
    "class:MEMORY_MB": Resource(name="memory", suffix="Mi"),
    "class:DISK_GB": Resource(name="ephemeral-storage", suffix="Gi"),
    "servers": Resource(name="servers"),
}
_VOLUME = {
    "volumes": Resource(name="volumes"),
    "snapshots": Resource(name="snapshots"),
    "backups": Resource(name="backups"),
    "gigabytes": Resource(name="storage", suffix="Gi"),
    "backup_gigabytes": Resource(name="backup-storage", suffix="Gi"),
}
#: service type -> Keystone resource name -> ledger resource
RESOURCE_MAPS: Mapping[str, Mapping[str, Resource]] = {
    "compute": _COMPUTE,
    "accelerator": {"accelerators": Resource(name="accelerators")},
    "block-storage": _VOLUME,
    "volume": _VOLUME,
    "volumev3": _VOLUME,
}


def ledger_resource(service_type: str, resource_name: str) -> Resource:
    """The ledger resource a Keystone resource name of a service type is counted as.

    Raises :class:`~quota_ledger.model.errors.InvalidRequest` when the name cannot be a ledger
    resource name even with ``:`` spelled ``/``."""
    known = RESOURCE_MAPS.get(service_type, {}).get(resource_name)
    if known is not None:
        return known
    return Resource(name=validation.resource(resource_name.replace(":", "/")))


@dataclass(frozen=True, kw_only=True, slots=True)
class Selection:
    """Which of Keystone's limits apply: those of the given services (all when None) and region.

    With a region, limits of that region and limits of no region apply (the region's win);
    without one, only limits of no region do."""

    service_ids: frozenset[str] | None = None
    region_id: str | None = None
    missing: MissingRegistered = MissingRegistered.ZERO
    partition: str = DEFAULT_PARTITION


class MappingProblem(InvalidRequest):
    """Keystone's limits cannot be mapped onto ledger queues; nothing was changed."""


def _applies(service_id: str, region_id: str | None, selection: Selection) -> bool:
    if selection.service_ids is not None and service_id not in selection.service_ids:
        return False
    return region_id is None or region_id == selection.region_id


def _key(
    limits: KeystoneLimits, service_id: str, name: str, owners: dict[str, tuple[str, str]]
) -> tuple[str, Resource]:
    """(the resource's key, its ledger resource); two Keystone names on one ledger name are refused."""
    resource = ledger_resource(limits.services.get(service_id, ""), name)
    owner = owners.setdefault(resource.name, (service_id, name))
    if owner != (service_id, name):
        raise MappingProblem(
            f"Keystone resources {owner[1]!r} (service {owner[0]}) and {name!r} (service {service_id}) "
            f"would both be the ledger's {resource.name!r}: select one service",
            field="service",
        )
    return resource.name, resource


def _pick(
    found: dict[tuple[str, str], tuple[int, bool]], who: str, name: str, value: int, regional: bool
) -> None:
    """Keep the region's own limit over one of no region."""
    old = found.get((who, name))
    if old is None or (regional and not old[1]):
        found[(who, name)] = (value, regional)


@dataclass(frozen=True, slots=True)
class _Table:
    resources: dict[str, Resource]
    defaults: dict[str, int]
    projects: dict[str, dict[str, int]]
    domains: dict[str, dict[str, int]]


def _table(limits: KeystoneLimits, selection: Selection) -> _Table:
    owners: dict[str, tuple[str, str]] = {}
    resources: dict[str, Resource] = {}
    defaults: dict[tuple[str, str], tuple[int, bool]] = {}
    own: dict[tuple[str, str], tuple[int, bool]] = {}
    domain: dict[tuple[str, str], tuple[int, bool]] = {}
    for reg in limits.registered:
        if _applies(reg.service_id, reg.region_id, selection):
            key, res = _key(limits, reg.service_id, reg.resource_name, owners)
            resources[key] = res
            _pick(defaults, "", key, reg.default_limit, reg.region_id is not None)
    for lim in limits.project_limits:
        if _applies(lim.service_id, lim.region_id, selection):
            key, res = _key(limits, lim.service_id, lim.resource_name, owners)
            resources[key] = res
            _pick(own, lim.project_id, key, lim.resource_limit, lim.region_id is not None)
    if limits.model is EnforcementModel.STRICT_TWO_LEVEL:
        for dom in limits.domain_limits:
            if _applies(dom.service_id, dom.region_id, selection):
                key, res = _key(limits, dom.service_id, dom.resource_name, owners)
                resources[key] = res
                _pick(domain, dom.domain_id, key, dom.resource_limit, dom.region_id is not None)
    projects: dict[str, dict[str, int]] = {}
    for (who, key), (value, _) in own.items():
        projects.setdefault(who, {})[key] = value
    domains: dict[str, dict[str, int]] = {}
    for (who, key), (value, _) in domain.items():
        domains.setdefault(who, {})[key] = value
    return _Table(resources, {k: v for (_, k), (v, _) in defaults.items()}, projects, domains)


def _effective(table: _Table, own: Mapping[str, int], missing: MissingRegistered) -> dict[str, int]:
    """resource -> limit (-1: unlimited) of one project or domain."""
    found = {}
    for key in table.resources:
        if key in own:
            found[key] = own[key]
        elif key in table.defaults:
            found[key] = table.defaults[key]
        else:
            found[key] = 0 if missing is MissingRegistered.ZERO else UNLIMITED
    return found


def _queue(
    name: str, limits: Mapping[str, int], table: _Table, children: list[dict[str, Any]]
) -> dict[str, Any]:
    maximum = {
        key: table.resources[key].quantity(value) for key, value in sorted(limits.items()) if value >= 0
    }
    queue: dict[str, Any] = {"name": name}
    if children:
        queue["parent"] = True
    if maximum:
        queue["resources"] = {"max": maximum}
    queue["properties"] = {MANAGED_BY: KEYSTONE}
    if children:
        queue["queues"] = children
    return queue


def owned_queues(limits: KeystoneLimits, selection: Selection) -> list[dict[str, Any]]:
    """The queues below root that Keystone's limits make, in configuration form, sorted by name.

    Raises :class:`MappingProblem` when two Keystone resources of the selected services would be
    one ledger resource."""
    table = _table(limits, selection)
    if limits.model is EnforcementModel.FLAT:
        return [
            _queue(p.id, _effective(table, table.projects.get(p.id, {}), selection.missing), table, [])
            for p in sorted(limits.projects, key=lambda p: p.id)
        ]
    by_domain: dict[str, list[Project]] = {}
    for project in limits.projects:
        by_domain.setdefault(project.domain_id, []).append(project)
    made = []
    for domain_id in sorted(by_domain):
        cap = _effective(table, table.domains.get(domain_id, {}), selection.missing)
        children = []
        for project in sorted(by_domain[domain_id], key=lambda p: p.id):
            own = _effective(table, table.projects.get(project.id, {}), selection.missing)
            capped = {k: _cap(v, cap[k]) for k, v in own.items()}
            children.append(_queue(project.id, capped, table, []))
        made.append(_queue(domain_id, cap, table, children))
    return made


def _cap(value: int, cap: int) -> int:
    if cap < 0:
        return value
    return cap if value < 0 else min(value, cap)


def queue_path(limits_model: EnforcementModel, project: Project) -> str:
    """The ledger queue of a project under a model."""
    if limits_model is EnforcementModel.FLAT:
        return f"{ROOT}.{project.id}"
    return f"{ROOT}.{project.domain_id}.{project.id}"


def is_owned(queue: Mapping[str, Any]) -> bool:
    """Whether a queue of a configuration document is one the Keystone sync owns."""
    return (queue.get("properties") or {}).get(MANAGED_BY) == KEYSTONE


def merged(
    current: Mapping[str, Any], owned: Sequence[dict[str, Any]], *, partition: str = DEFAULT_PARTITION
) -> dict[str, Any]:
    """``current`` (a configuration document) with root's Keystone-owned queues of ``partition``
    replaced by ``owned``, after root's other queues; everything else as it was."""
    document = copy.deepcopy(dict(current))
    if set(document) == {"version", "config"}:  # the service's {"version", "config"} answer
        document = copy.deepcopy(dict(document["config"]))
    partitions: list[dict[str, Any]] = list(document.get("partitions") or [])
    part = next((p for p in partitions if (p.get("name") or DEFAULT_PARTITION) == partition), None)
    if part is None:
        part = {"name": partition, "queues": [{"name": ROOT}]}
        partitions.append(part)
    queues: list[dict[str, Any]] = list(part.get("queues") or [])
    root = next((q for q in queues if str(q.get("name", "")).lower() == ROOT), None)
    if root is None:
        root = {"name": ROOT}
        queues.insert(0, root)
    kept = [q for q in root.get("queues") or [] if not is_owned(q)]
    root["queues"] = [*kept, *copy.deepcopy(list(owned))]
    if not root["queues"]:
        del root["queues"]
    part["queues"] = queues
    document["partitions"] = partitions
    return document


def owned_paths(queues: Iterable[Mapping[str, Any]], prefix: str = ROOT) -> set[str]:
    """The paths of the owned queues of a list of root's children (and theirs)."""
    found: set[str] = set()
    for queue in queues:
        if is_owned(queue):
            path = f"{prefix}.{queue.get('name')}"
            found.add(path)
            found |= owned_paths(queue.get("queues") or [], path)
    return found
