"""The ResourceQuota admission plugin's configuration and its covering-quota rules.

``limitedResources`` entries name a resource (``pods``) with ``matchContains`` (substrings of quota
names such as ``cpu``) and ``matchScopes`` (scope requirements). A request that consumes a limited
resource name, or matches a limited scope, is refused unless a quota in its namespace covers it
(``CheckRequest`` in ``plugin/pkg/admission/resourcequota/controller.go``). As in Kubernetes, the
limited scopes are collected from every entry whatever its resource, each requirement is matched
on its own, and a scope counts as covered when some quota's matching requirement has the same
``scopeName`` (operator and values are not compared).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from quota_ledger.kube.pods import PodScopes
from quota_ledger.kube.quotas import Requirement, ResourceQuota, parse_requirements
from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidRequest, InvalidResourceQuota


@dataclass(frozen=True, slots=True)
class LimitedResource:
    resource: str
    api_group: str = ""
    match_contains: tuple[str, ...] = ()
    match_scopes: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    limited: tuple[LimitedResource, ...] = ()
    manifest: Mapping[str, Any] | None = None


def parse(manifest: Any) -> AdmissionConfig:
    """An ``AdmissionConfiguration`` (with a ``ResourceQuota`` plugin) or a bare
    ``ResourceQuotaConfiguration``."""
    doc = validation.manifest(manifest, "admission")
    if not isinstance(doc, Mapping):
        raise InvalidRequest("an admission configuration must be a mapping", field="admission")
    config: Mapping[str, Any] = doc
    where = ""
    if doc.get("kind") == "AdmissionConfiguration":
        plugins = doc.get("plugins", [])
        if not isinstance(plugins, list):
            raise InvalidResourceQuota([("plugins", "must be a list of plugins")])
        bad = [
            i
            for i, p in enumerate(plugins)
            if not isinstance(p, Mapping) or not isinstance(p.get("name"), str)
        ]
        if bad:
            raise InvalidResourceQuota([(f"plugins[{bad[0]}]", "must be a mapping with a name")])
        found = [p for p in plugins if p.get("name") == "ResourceQuota"]
        if not found:
            return AdmissionConfig((), doc)  # no ResourceQuota plugin: nothing is limited
        config = found[0].get("configuration") or {}
        where = "plugins[ResourceQuota].configuration."
        if not isinstance(config, Mapping):
            raise InvalidRequest("the ResourceQuota plugin configuration must be a mapping", field=where)
    elif doc.get("kind", "ResourceQuotaConfiguration") != "ResourceQuotaConfiguration":
        raise InvalidRequest(f"unexpected kind {doc.get('kind')!r}", field="kind")
    errors: list[tuple[str, str]] = []
    entries = config.get("limitedResources") or []
    if not isinstance(entries, list):
        raise InvalidResourceQuota([(f"{where}limitedResources", "must be a list")])
    limited = []
    for index, entry in enumerate(entries):
        path = f"{where}limitedResources[{index}]"
        if not isinstance(entry, Mapping):
            errors.append((path, "must be a mapping"))
            continue
        resource = entry.get("resource")
        if not isinstance(resource, str) or not resource:
            errors.append((f"{path}.resource", "Required value"))
            continue
        contains = entry.get("matchContains") or []
        if not isinstance(contains, list) or not all(isinstance(c, str) for c in contains):
            errors.append((f"{path}.matchContains", "must be a list of strings"))
            continue
        scopes = parse_requirements(entry.get("matchScopes"), f"{path}.matchScopes", errors)
        group = str(entry.get("apiGroup") or "")
        limited.append(LimitedResource(resource, group, tuple(contains), tuple(scopes)))
    if errors:
        raise InvalidResourceQuota(errors)
    return AdmissionConfig(tuple(limited), doc)


def uncovered(
    config: AdmissionConfig,
    pod: PodScopes,
    usage: Mapping[str, int],
    quotas: Iterable[ResourceQuota],
) -> tuple[list[str], list[Requirement]]:
    """(resource names, scopes) the pod consumes or matches that no quota in its namespace covers."""
    quota_list = list(quotas)
    limited_scopes = [r for entry in config.limited for r in entry.match_scopes if r.matches(pod)]
    limited_names = {
        name
        for entry in config.limited
        if entry.resource == "pods" and entry.api_group == ""
        for name, amount in usage.items()
        if amount > 0 and any(fragment in name for fragment in entry.match_contains)
    }
    matched_scopes = {r.scope for q in quota_list for r in q.requirements if r.matches(pod)}
    covered = {name for q in quota_list if q.matches(pod) for name in q.tracked()}
    missing_names = sorted(limited_names - covered)
    missing_scopes = [r for r in limited_scopes if r.scope not in matched_scopes]
    return missing_names, missing_scopes
