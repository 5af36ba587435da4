"""ResourceQuota objects: validation as the API server does it, and scope matching.

Sources: ``pkg/apis/core/validation`` (``validateResourceQuotaScopes``), ``pkg/apis/core/helper``
(``IsResourceQuotaScopeValidForResource``) and ``pkg/quota/v1/evaluator/core/pods.go``
(``podMatchesScopeFunc``). Amounts are in ledger units: milli-cores for the cpu names, bytes or
counts for everything else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from quota_ledger.kube.pods import PodScopes
from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidQuantity, InvalidRequest, InvalidResourceQuota
from quota_ledger.model.quantity import KUBE_CPU_NAMES, MAX_QUANTITY, format_quantity, parse_fraction

SCOPES = (
    "Terminating",
    "NotTerminating",
    "BestEffort",
    "NotBestEffort",
    "PriorityClass",
    "CrossNamespacePodAffinity",
)
_EXISTS_ONLY = frozenset(SCOPES) - {"PriorityClass"}
_CONFLICTS = (("BestEffort", "NotBestEffort"), ("Terminating", "NotTerminating"))
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
#: resources each scope may be applied to (standard quota names only)
_COMPUTE_NAMES = frozenset(
    {"pods", "cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"}
)
_STANDARD_NAMES = frozenset(
    {
        "pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "configmaps",
        "persistentvolumeclaims", "services.nodeports", "services.loadbalancers", "cpu", "memory",
        "requests.cpu", "requests.memory", "requests.storage", "requests.ephemeral-storage",
        "limits.cpu", "limits.memory", "limits.ephemeral-storage", "ephemeral-storage",
    }
)  # fmt: skip
_INTEGER_NAMES = frozenset(
    {
        "pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "configmaps",
        "persistentvolumeclaims", "services.nodeports", "services.loadbalancers",
    }
)  # fmt: skip
_CPU_NAMES = KUBE_CPU_NAMES
#: names the pod evaluator tracks besides ``requests.<anything>``
_POD_NAMES = frozenset(
    {"pods", "count/pods", "cpu", "memory", "ephemeral-storage", "limits.cpu", "limits.memory",
     "limits.ephemeral-storage"}
)  # fmt: skip
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_RESOURCE = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True)
class Requirement:
    scope: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, pod: PodScopes) -> bool:
        if self.scope == "PriorityClass":
            name = pod.priority_class
            if self.operator == "Exists":
                return bool(name)
            if self.operator == "DoesNotExist":
                return not name
            if self.operator == "In":
                return bool(name) and name in self.values
            return not name or name not in self.values  # NotIn: a pod without one matches
        return {
            "Terminating": pod.terminating,
            "NotTerminating": not pod.terminating,
            "BestEffort": pod.best_effort,
            "NotBestEffort": not pod.best_effort,
            "CrossNamespacePodAffinity": pod.cross_namespace_affinity,
        }.get(self.scope, False)

    def describe(self) -> str:
        return f"{{{self.scope} {self.operator} [{' '.join(self.values)}]}}"

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"scopeName": self.scope, "operator": self.operator}
        if self.values:
            found["values"] = list(self.values)
        return found


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    namespace: str
    name: str
    #: quota name -> limit in ledger units
    hard: Mapping[str, int]
    #: ``spec.scopes`` as Exists requirements, then ``spec.scopeSelector``: all must match
    requirements: tuple[Requirement, ...]
    manifest: Mapping[str, Any]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def tracked(self) -> list[str]:
        """Hard names a pod consumes (the pod evaluator's ``MatchingResources``)."""
        return [name for name in self.hard if pod_tracks(name)]

    def matches(self, pod: PodScopes) -> bool:
        """All requirements hold and the quota limits something a pod consumes."""
        return bool(self.tracked()) and all(r.matches(pod) for r in self.requirements)


def pod_tracks(name: str) -> bool:
    """Whether the pod evaluator tracks quota name ``name`` (huge pages under both names)."""
    return name in _POD_NAMES or name.startswith(("requests.", "hugepages-"))


def is_standard_quota_name(name: str) -> bool:
    """Whether a quota may name ``name`` (``IsStandardQuotaResourceName``; names with a ``/`` pass)."""
    return "/" in name or name in _STANDARD_NAMES or name.startswith(("hugepages-", "requests.hugepages-"))


def is_cpu(name: str) -> bool:
    return name in _CPU_NAMES


def parse(manifest: Any) -> ResourceQuota:
    doc = _document(manifest, "ResourceQuota")
    errors: list[tuple[str, str]] = []
    meta: Mapping[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    for value, where in ((name, "metadata.name"), (namespace, "metadata.namespace")):
        if not isinstance(value, str) or not value:
            errors.append((where, "Required value"))
        elif not validation.is_subdomain(value):
            errors.append((where, f"Invalid value: {value!r}: a lowercase RFC 1123 subdomain"))
    spec: Mapping[str, Any] = doc["spec"] if isinstance(doc.get("spec"), Mapping) else {}
    hard = _hard(spec.get("hard") or {}, errors)
    requirements = _requirements(spec, errors)
    for requirement in requirements:
        for resource in hard:
            if resource in _STANDARD_NAMES and not _scope_allows(requirement.scope, resource):
                errors.append(
                    (f"spec.hard[{resource}]", f"unsupported scope applied to resource: {requirement.scope}")
                )
    if isinstance(name, str) and isinstance(namespace, str) and len(name) + len(namespace) > 187:
        errors.append(("metadata.name", "Invalid value: namespace/name longer than 187 characters"))
    if errors:
        raise InvalidResourceQuota(errors)
    assert isinstance(name, str)
    assert isinstance(namespace, str)
    return ResourceQuota(namespace, name, hard, tuple(requirements), doc)


def parse_requirements(items: object, where: str, errors: list[tuple[str, str]]) -> list[Requirement]:
    """``matchExpressions``-style lists (also the admission config's ``matchScopes``)."""
    if items is None:
        return []
    if not isinstance(items, list):
        errors.append((where, "must be a list"))
        return []
    found = []
    for index, item in enumerate(items):
        path = f"{where}[{index}]"
        if not isinstance(item, Mapping):
            errors.append((path, "must be a mapping"))
            continue
        scope, operator, values = item.get("scopeName"), item.get("operator"), item.get("values") or []
        if scope not in SCOPES:
            errors.append((f"{path}.scopeName", f"Invalid value: {scope!r}: unsupported scope"))
            continue
        if operator not in _OPERATORS:
            errors.append((f"{path}.operator", f"Invalid value: {operator!r}: not a valid selector operator"))
            continue
        if scope in _EXISTS_ONLY and operator != "Exists":
            errors.append(
                (
                    f"{path}.operator",
                    f"Invalid value: {operator!r}: must be 'Exists' when scope is any of "
                    "ResourceQuotaScopeTerminating, ResourceQuotaScopeNotTerminating, "
                    "ResourceQuotaScopeBestEffort, ResourceQuotaScopeNotBestEffort or "
                    "ResourceQuotaScopeCrossNamespacePodAffinity",
                )
            )
            continue
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            errors.append((f"{path}.values", "must be a list of strings"))
            continue
        if operator in ("In", "NotIn") and not values:
            errors.append(
                (f"{path}.values", "Required value: must be at least one value when `operator` is 'In' or "
                 "'NotIn' for scope selector")
            )  # fmt: skip
            continue
        if operator in ("Exists", "DoesNotExist") and values:
            errors.append(
                (f"{path}.values", "Invalid value: must be no value when `operator` is 'Exist' or "
                 "'DoesNotExist' for scope selector")
            )  # fmt: skip
            continue
        bad = [v for v in values if len(v) > 63 or not _LABEL_VALUE.fullmatch(v)]
        if bad:
            errors.append((f"{path}.values", f"Invalid value: {bad[0]!r}: not a valid label value"))
            continue
        found.append(Requirement(scope, operator, tuple(values)))
    _conflicts([r.scope for r in found], where, errors)
    return found


def _requirements(spec: Mapping[str, Any], errors: list[tuple[str, str]]) -> list[Requirement]:
    scopes = spec.get("scopes") or []
    found: list[Requirement] = []
    if not isinstance(scopes, list):
        errors.append(("spec.scopes", "must be a list"))
        scopes = []
    for index, scope in enumerate(scopes):
        if scope not in SCOPES:
            errors.append((f"spec.scopes[{index}]", f"Invalid value: {scope!r}: unsupported scope"))
        else:
            found.append(Requirement(scope, "Exists"))
    _conflicts([r.scope for r in found], "spec.scopes", errors)
    selector = spec.get("scopeSelector")
    if selector is not None:
        if not isinstance(selector, Mapping):
            errors.append(("spec.scopeSelector", "must be a mapping"))
        else:
            found += parse_requirements(
                selector.get("matchExpressions"), "spec.scopeSelector.matchExpressions", errors
            )
    return found


def _conflicts(scopes: Iterable[str], where: str, errors: list[tuple[str, str]]) -> None:
    present = set(scopes)
    for a, b in _CONFLICTS:
        if a in present and b in present:
            errors.append((where, f"Invalid value: [{a} {b}]: conflicting scopes"))


def _scope_allows(scope: str, resource: str) -> bool:
    if scope == "BestEffort":
        return resource == "pods"
    return resource in _COMPUTE_NAMES


def _hard(values: object, errors: list[tuple[str, str]]) -> dict[str, int]:
    if not isinstance(values, Mapping):
        errors.append(("spec.hard", "must be a mapping"))
        return {}
    hard = {}
    for resource, text in values.items():
        where = f"spec.hard[{resource}]"
        if not isinstance(resource, str) or len(resource) > 253 or not _RESOURCE.fullmatch(resource):
            errors.append((where, "Invalid value: not a valid resource name"))
            continue
        if not is_standard_quota_name(resource):
            errors.append((where, f"Invalid value: {resource!r}: must be a standard resource for quota"))
            continue
        try:
            hard[resource] = hard_value(resource, text)
        except InvalidQuantity as error:
            errors.append((where, f"Invalid value: {str(text)!r}: {error.reason}"))
    return dict(sorted(hard.items()))


def hard_value(resource: str, text: object) -> int:
    """A quantity in ledger units; negative values and fractional counts are refused."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise InvalidQuantity(resource, str(text), "quantities must be strings or integers")
    exact = parse_fraction(str(text), resource=resource)
    if exact < 0:
        raise InvalidQuantity(resource, str(text), "must be greater than or equal to 0")
    integer = resource in _INTEGER_NAMES or resource.startswith("count/") or _extended(resource)
    if integer and exact.denominator != 1:
        raise InvalidQuantity(resource, str(text), "must be an integer")
    scaled = exact * 1000 if is_cpu(resource) else exact
    value = -(-scaled.numerator // scaled.denominator)
    if value > MAX_QUANTITY:
        raise InvalidQuantity(resource, str(text), "must be less than 2^63")
    return value


def _extended(resource: str) -> bool:
    """``requests.<domain>/<name>`` outside kubernetes.io: an extended (integer) resource."""
    if not resource.startswith("requests."):
        return False
    inner = resource.removeprefix("requests.")
    return "/" in inner and not inner.split("/")[0].endswith("kubernetes.io")


def _document(manifest: Any, kind: str) -> Mapping[str, Any]:
    manifest = validation.manifest(manifest, kind)
    if not isinstance(manifest, Mapping):
        raise InvalidRequest(f"a {kind} manifest must be a mapping", field=kind)
    if manifest.get("kind", kind) != kind:
        raise InvalidRequest(f"expected a {kind}, not {manifest.get('kind')!r}", field="kind")
    return manifest


def stored_manifest(quota: ResourceQuota) -> Any:
    """What the ledger keeps of a quota: name, namespace and spec (JSON-safe)."""
    spec = quota.manifest.get("spec") or {}
    return json_safe(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": quota.name, "namespace": quota.namespace},
            "spec": spec,
        }
    )


def json_safe(value: Any) -> Any:
    """A copy that JSON can hold (YAML may produce dates and the like: they become text)."""
    return json.loads(json.dumps(value, default=str))


def format_value(resource: str, units: int) -> str:
    """A ledger amount as the shortest exact Kubernetes quantity (cpu names in milli-cores)."""
    return format_quantity("cpu" if is_cpu(resource) else "memory", units)
