"""Where an :class:`~quota_ledger.openstack.enforcer.Enforcer` learns Keystone's limits.

A source reads Keystone's view (:meth:`read`: the model, the registered limits, the limits and
projects it knows, the services) and looks a project up on demand (:meth:`project`), as
:class:`~quota_ledger.openstack.keystone.KeystoneReader` does for the Keystone sync.
:class:`OsloLimitSource` reads the way oslo.limit reads, through its ``_EnforcerUtils`` and the
``[oslo_limit]`` options, so that oslo.limit's own ``LimitFixture`` answers it in tests and
offline; :class:`GivenLimits` holds limits the caller already has.
"""

from __future__ import annotations

from typing import Any, Protocol

from quota_ledger.openstack.unified_limits import (
    DomainLimit,
    EnforcementModel,
    KeystoneLimits,
    Project,
    ProjectLimit,
    RegisteredLimit,
)

#: the domain of a flat model's projects when the source cannot tell (flat ignores domains)
DEFAULT_DOMAIN = "default"

#: service id -> (service type, service name)
Services = dict[str, tuple[str, str]]


class LimitSource(Protocol):
    """Keystone's limits: :class:`~quota_ledger.openstack.keystone.KeystoneReader` is one."""

    def read(self) -> tuple[KeystoneLimits, Services]:
        """The model, registered limits, limits and projects, and the services by id."""

    def project(self, project_id: str) -> tuple[Project, tuple[ProjectLimit, ...]] | None:
        """One project and its own limits; None when there is no such project."""


def model_named(name: str) -> EnforcementModel:
    """Keystone's model name (``strict_two_level``; oslo.limit spells it ``strict-two-level``)."""
    try:
        return EnforcementModel(name.replace("-", "_"))
    except ValueError:
        raise ValueError(f"enforcement model {name} is not supported") from None


class GivenLimits:
    """Limits the caller has. Under the flat model a project they do not list is found, in
    the default domain, with no limits of its own (domains do not count there)."""

    def __init__(self, limits: KeystoneLimits, services: Services | None = None) -> None:
        self.limits = limits
        self.services: Services = dict(services or {})

    def read(self) -> tuple[KeystoneLimits, Services]:
        return self.limits, dict(self.services)

    def project(self, project_id: str) -> tuple[Project, tuple[ProjectLimit, ...]] | None:
        own = tuple(p for p in self.limits.project_limits if p.project_id == project_id)
        for project in self.limits.projects:
            if project.id == project_id:
                return project, own
        if self.limits.model is EnforcementModel.FLAT:
            return Project(id=project_id, domain_id=DEFAULT_DOMAIN), own
        return None


class OsloLimitSource:
    """Keystone's limits read as oslo.limit reads them.

    The ``[oslo_limit]`` options name the endpoint, so the service and region; oslo.limit's
    ``_EnforcerUtils`` reads the registered limits and a project's limits, and oslo.limit's
    enforcer asks Keystone for the model. ``oslo_limit.fixture.LimitFixture`` patches exactly
    this path, so the source works offline under it (with the flat model it answers).
    """

    def __init__(self) -> None:
        from oslo_config import cfg
        from oslo_limit import limit as oslo_limit

        # Cached by the enforcer, not here: a read asks Keystone again.
        self._utils = oslo_limit._EnforcerUtils(cache=False)
        #: oslo.limit's enforcer asks for the model through ``self.connection``
        self.connection = self._utils.connection
        self.model = model_named(oslo_limit.Enforcer._get_enforcement_model(self))  # type: ignore[arg-type]
        self.service_id: str = self._utils._service_id
        self.region_id: str | None = self._utils._region_id
        options = cfg.CONF.oslo_limit
        self.services: Services = {
            self.service_id: (options.endpoint_service_type or "", options.endpoint_service_name or "")
        }

    def read(self) -> tuple[KeystoneLimits, Services]:
        registered = tuple(
            RegisteredLimit(service_id=self.service_id, resource_name=name, default_limit=int(value))
            for name, value in self._utils.get_registered_limits(None)
        )
        # The endpoint's limits of every project (and domain) at once, as _EnforcerUtils reads
        # one project's; they are already of this service and region.
        project_limits: list[ProjectLimit] = []
        domain_limits: list[DomainLimit] = []
        for found in self.connection.limits(service_id=self.service_id, region_id=self.region_id):
            if found.project_id:
                project_limits.append(
                    self._limit(str(found.project_id), found.resource_name, found.resource_limit)
                )
            elif self.model is EnforcementModel.STRICT_TWO_LEVEL and found.domain_id:
                domain_limits.append(
                    DomainLimit(
                        domain_id=str(found.domain_id),
                        service_id=self.service_id,
                        resource_name=found.resource_name,
                        resource_limit=int(found.resource_limit),
                    )
                )
        projects = tuple(self._place(p) for p in sorted({lim.project_id for lim in project_limits}))
        limits = KeystoneLimits(
            model=self.model,
            registered=registered,
            project_limits=tuple(project_limits),
            domain_limits=tuple(domain_limits),
            projects=projects,
            services={sid: kind for sid, (kind, _) in self.services.items()},
        )
        return limits, dict(self.services)

    def project(self, project_id: str) -> tuple[Project, tuple[ProjectLimit, ...]] | None:
        own = tuple(
            self._limit(project_id, name, value)
            for name, value in self._utils.get_project_limits(project_id, None)
        )
        return self._place(project_id), own

    def _limit(self, project_id: str, name: str, value: Any) -> ProjectLimit:
        return ProjectLimit(
            project_id=project_id, service_id=self.service_id, resource_name=name, resource_limit=int(value)
        )

    def _place(self, project_id: str) -> Project:
        """The project with its domain (asked of Keystone only where domains count)."""
        if self.model is EnforcementModel.FLAT:
            return Project(id=project_id, domain_id=DEFAULT_DOMAIN)
        found: Any = self.connection.get_project(project_id)
        return Project(id=project_id, domain_id=str(found.domain_id))
