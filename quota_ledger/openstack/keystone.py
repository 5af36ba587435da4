"""Reading Keystone's unified limits through keystoneauth1 (the ``openstack`` extra).

One :class:`KeystoneReader` wraps a keystoneauth1 session and reads, with the session's token,
``GET /v3/limits/model``, ``/v3/registered_limits``, ``/v3/limits``, ``/v3/projects`` and
``/v3/services`` into the values of :mod:`.limits`. A session comes from a ``clouds.yaml``
cloud name or the usual ``OS_*`` environment variables (:func:`session_for`, through
openstacksdk's configuration loader), or is built by the caller. No credential appears in a
log line or an error: errors name the endpoint and what failed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.openstack.unified_limits import (
    DomainLimit,
    EnforcementModel,
    KeystoneLimits,
    Project,
    ProjectLimit,
    RegisteredLimit,
)

log = logging.getLogger("quota_ledger.openstack")


class KeystoneError(QuotaLedgerError):
    """Keystone's limits could not be read; nothing was changed."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        #: Keystone's HTTP status, when it answered
        self.status = status
        super().__init__(message, status=status)


class KeystoneUnreachable(KeystoneError):
    """Keystone could not be reached (refused, timed out, or answered 5xx); the limits of the
    last sync stay in force."""


class OpenStackNotInstalled(QuotaLedgerError):
    """The OpenStack libraries are missing: pip install 'quota-ledger[openstack]'."""


def _libraries() -> tuple[Any, Any]:
    try:
        from keystoneauth1 import adapter, exceptions
    except ImportError as exc:
        raise OpenStackNotInstalled() from exc
    return adapter, exceptions


def session_for(cloud: str | None = None) -> Any:
    """A keystoneauth1 session for the ``clouds.yaml`` cloud named ``cloud``, or (None) for
    ``OS_CLOUD`` or the ``OS_AUTH_URL``, ``OS_USERNAME``... environment variables, as the
    ``openstack`` command line reads them."""
    try:
        import openstack.config
        from openstack import exceptions as sdk_exceptions
    except ImportError as exc:
        raise OpenStackNotInstalled() from exc
    _, errors = _libraries()
    try:
        region = openstack.config.get_cloud_region(cloud=cloud)
        return region.get_session()
    except (sdk_exceptions.ConfigException, errors.ClientException) as exc:
        # the loader's and the auth plugin's words name what is missing, never a secret's value
        named = f"cloud {cloud!r}" if cloud else "OS_CLOUD or the OS_* variables"
        raise KeystoneError(f"no usable OpenStack credentials in {named}: {exc}") from exc


class KeystoneReader:
    """Reads what :mod:`.limits` maps, from the identity endpoint of a keystoneauth1 session."""

    def __init__(self, session: Any, *, interface: str = "public", region_name: str | None = None) -> None:
        adapter, self._errors = _libraries()
        self._api = adapter.Adapter(
            session=session,
            service_type="identity",
            interface=interface,
            region_name=region_name,
            version=(3, 0),
        )

    def _get(self, path: str, **params: str) -> Mapping[str, Any]:
        errors = self._errors
        try:
            response = self._api.get(path, params=params or None, raise_exc=False)
        except errors.DiscoveryFailure as exc:
            raise KeystoneUnreachable(f"cannot find Keystone's identity v3 endpoint: {exc}") from exc
        except (errors.ConnectFailure, errors.ConnectionError, errors.ConnectTimeout) as exc:
            raise KeystoneUnreachable(f"cannot reach Keystone ({type(exc).__name__}) for {path}") from exc
        except errors.Unauthorized as exc:
            raise KeystoneError("Keystone refused the credentials", status=401) from exc
        except errors.ClientException as exc:
            raise KeystoneUnreachable(f"cannot read {path} from Keystone: {type(exc).__name__}") from exc
        status = int(response.status_code)
        if status >= 500:
            raise KeystoneUnreachable(f"Keystone answered {status} to GET {path}", status=status)
        if status >= 400:
            raise KeystoneError(f"Keystone answered {status} to GET {path}", status=status)
        body = response.json()
        if not isinstance(body, Mapping):
            raise KeystoneError(f"Keystone's answer to GET {path} is not a JSON object")
        return body

    def _items(self, path: str, key: str, **params: str) -> Iterator[Mapping[str, Any]]:
        body = self._get(path, **params)
        yield from body.get(key) or []
        seen = {path}
        while (nxt := (body.get("links") or {}).get("next")) and nxt not in seen:
            seen.add(nxt)
            body = self._get(nxt)
            yield from body.get(key) or []

    def model(self) -> EnforcementModel:
        """The enforcement model Keystone is configured with."""
        name = (self._get("/limits/model").get("model") or {}).get("name")
        try:
            return EnforcementModel(name)
        except ValueError as exc:
            raise KeystoneError(f"unknown enforcement model {name!r}") from exc

    def services(self) -> dict[str, tuple[str, str]]:
        """service id -> (type, name) of every service in the catalog."""
        return {
            str(s["id"]): (str(s.get("type") or ""), str(s.get("name") or ""))
            for s in self._items("/services", "services")
        }

    def read(self) -> tuple[KeystoneLimits, dict[str, tuple[str, str]]]:
        """Everything one sync maps (and the catalog's services, to select by name or type)."""
        model = self.model()
        services = self.services()
        registered = tuple(
            RegisteredLimit(
                service_id=str(r["service_id"]),
                region_id=r.get("region_id"),
                resource_name=str(r["resource_name"]),
                default_limit=int(r["default_limit"]),
            )
            for r in self._items("/registered_limits", "registered_limits")
        )
        project_limits: list[ProjectLimit] = []
        domain_limits: list[DomainLimit] = []
        for limit in self._items("/limits", "limits"):
            if limit.get("project_id"):
                project_limits.append(_project_limit(limit))
            elif limit.get("domain_id"):
                domain_limits.append(
                    DomainLimit(
                        domain_id=str(limit["domain_id"]),
                        service_id=str(limit["service_id"]),
                        region_id=limit.get("region_id"),
                        resource_name=str(limit["resource_name"]),
                        resource_limit=int(limit["resource_limit"]),
                    )
                )
        projects = tuple(_project(p) for p in self._items("/projects", "projects") if not p.get("is_domain"))
        found = KeystoneLimits(
            model=model,
            registered=registered,
            project_limits=tuple(project_limits),
            domain_limits=tuple(domain_limits),
            projects=projects,
            services={sid: kind for sid, (kind, _) in services.items()},
        )
        return found, services

    def project(self, project_id: str) -> tuple[Project, tuple[ProjectLimit, ...]] | None:
        """One project and its own limits, or None when Keystone has no such project."""
        try:
            body = self._get(f"/projects/{project_id}")
        except KeystoneError as exc:
            if exc.status == 404:
                return None
            raise
        found = body.get("project") or {}
        if found.get("is_domain"):
            return None
        own = tuple(
            _project_limit(limit)
            for limit in self._items("/limits", "limits", project_id=project_id)
            if limit.get("project_id") == project_id
        )
        return _project(found), own


def _project(p: Mapping[str, Any]) -> Project:
    return Project(id=str(p["id"]), domain_id=str(p.get("domain_id") or ""), name=str(p.get("name") or ""))


def _project_limit(limit: Mapping[str, Any]) -> ProjectLimit:
    return ProjectLimit(
        project_id=str(limit["project_id"]),
        service_id=str(limit["service_id"]),
        region_id=limit.get("region_id"),
        resource_name=str(limit["resource_name"]),
        resource_limit=int(limit["resource_limit"]),
    )


class LazyReader:
    """A :class:`KeystoneReader` made on first use from a ``clouds.yaml`` cloud or the ``OS_*``
    variables (:func:`session_for`): a long-running process starts without a usable cloud, and
    each read says why until it is usable."""

    def __init__(self, cloud: str | None = None) -> None:
        self.cloud = cloud
        self._reader: KeystoneReader | None = None

    def _get(self) -> KeystoneReader:
        if self._reader is None:
            self._reader = KeystoneReader(session_for(self.cloud))
        return self._reader

    def read(self) -> tuple[KeystoneLimits, dict[str, tuple[str, str]]]:
        """See :meth:`KeystoneReader.read`."""
        return self._get().read()

    def project(self, project_id: str) -> tuple[Project, tuple[ProjectLimit, ...]] | None:
        """See :meth:`KeystoneReader.project`."""
        return self._get().project(project_id)
