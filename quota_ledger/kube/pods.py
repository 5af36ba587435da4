"""A v1 Pod as Kubernetes' quota evaluator sees it (``pkg/quota/v1/evaluator/core/pods.go``).

The request: containers summed, init containers by the max rule (a pod needs the larger of the
sum of its containers and its largest init container), then pod-level ``spec.resources`` in place
of that sum for the resources it sets (cpu, memory, hugepages), then pod overhead added. ``cpu``
is counted in milli-cores (the ledger's ``vcore``), memory and storage in bytes, extended
resources as counts. A container (or the pod level) that sets a limit but no request requests
its limit, as the API server's defaulting does. A pod with pod-level resources is not asked for
per-container cpu and memory values, as Kubernetes does not ask.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.quantity import parse_resources

#: compute resources a quota can demand on every container (Constraints in pods.go)
COMPUTE = ("cpu", "memory")
#: resources Kubernetes charges under their own name and as ``requests.<name>``
BOTH_NAMES = ("cpu", "memory", "ephemeral-storage")
#: so are resources with this prefix (huge pages of every size)
HUGEPAGES = "hugepages-"
#: the annotation YuniKorn's admission controller writes: {"user": ..., "groups": [...]}
USER_INFO = "yunikorn.apache.org/user.info"
#: labels naming the application, in YuniKorn's order of preference
APP_LABELS = ("applicationId", "yunikorn.apache.org/app-id", "spark-app-selector")


@dataclass(frozen=True, slots=True)
class PodScopes:
    """The attributes ResourceQuota scopes match on."""

    priority_class: str | None = None
    terminating: bool = False
    best_effort: bool = False
    cross_namespace_affinity: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "priorityClass": self.priority_class,
            "terminating": self.terminating,
            "bestEffort": self.best_effort,
            "crossNamespacePodAffinity": self.cross_namespace_affinity,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PodScopes:
        return cls(
            priority_class=data.get("priorityClass"),
            terminating=bool(data.get("terminating")),
            best_effort=bool(data.get("bestEffort")),
            cross_namespace_affinity=bool(data.get("crossNamespacePodAffinity")),
        )


@dataclass(frozen=True, slots=True)
class PodRequest:
    namespace: str
    name: str
    uid: str | None
    scopes: PodScopes
    #: ledger resources charged to queues, users and groups (vcore, memory, pods, extended)
    resources: dict[str, int]
    #: quota usage by Kubernetes quota name (pods, requests.cpu, limits.memory, ...)
    usage: dict[str, int]
    #: compute resource -> containers that set no request / no limit for it
    missing_requests: dict[str, list[str]] = field(default_factory=dict)
    missing_limits: dict[str, list[str]] = field(default_factory=dict)
    user: str | None = None
    groups: tuple[str, ...] = ()
    application: str | None = None


def load(manifest: Any) -> Mapping[str, Any]:
    manifest = validation.manifest(manifest, "pod")
    if not isinstance(manifest, Mapping):
        raise InvalidRequest("a Pod manifest must be a mapping", field="pod")
    return manifest


def parse_pod(manifest: Any) -> PodRequest:
    pod = load(manifest)
    if pod.get("kind", "Pod") != "Pod":
        raise InvalidRequest(f"expected a Pod, not {pod.get('kind')!r}", field="kind")
    meta = _mapping(pod.get("metadata"), "metadata")
    spec = _mapping(pod.get("spec"), "spec")
    # Only a missing (or empty-text) value means "not set": False, 0 or [] are refused, not defaulted.
    namespace = validation.namespace(_given(meta, "namespace", "default"), "metadata.namespace")
    name = _given(meta, "name", _given(meta, "generateName", ""))
    if not isinstance(name, str) or (name and not validation.is_subdomain(name.rstrip("-"))):
        validation.subdomain(name, "metadata.name")
    containers = _containers(spec.get("containers"), "spec.containers", required=True)
    inits = _containers(spec.get("initContainers"), "spec.initContainers", required=False)
    overhead = _quantities(_given(spec, "overhead", {}), "spec.overhead")
    pod_requests, pod_limits = _pod_level(spec.get("resources"))
    requests = _pod_total([c[1] for c in containers], [c[1] for c in inits], pod_requests, overhead)
    limits = _pod_total([c[2] for c in containers], [c[2] for c in inits], pod_limits, overhead)
    everyone = [*containers, *inits]
    if pod_requests or pod_limits:
        everyone = []  # the pod level answers for every container: nothing is missing
    missing_requests = {res: [n for n, req, _ in everyone if res not in req] for res in COMPUTE}
    missing_limits = {res: [n for n, _, lim in everyone if res not in lim] for res in COMPUTE}
    best_effort = not any(
        res in req or res in lim
        for _, req, lim in [*containers, *inits, ("", pod_requests, pod_limits)]
        for res in COMPUTE
    )
    deadline = spec.get("activeDeadlineSeconds")
    scopes = PodScopes(
        priority_class=validation.priority_class(
            _given(spec, "priorityClassName", None), "spec.priorityClassName"
        ),
        terminating=isinstance(deadline, int) and not isinstance(deadline, bool) and deadline >= 0,
        best_effort=best_effort,
        cross_namespace_affinity=_cross_namespace(spec.get("affinity")),
    )
    usage = quota_usage(requests, limits)
    resources = {("vcore" if res == "cpu" else res): v for res, v in requests.items() if v}
    resources["pods"] = 1
    user, groups = _user_info(meta)
    return PodRequest(
        namespace=namespace,
        name=name,
        uid=meta.get("uid") if isinstance(meta.get("uid"), str) else None,
        scopes=scopes,
        resources=dict(sorted(resources.items())),
        usage=usage,
        missing_requests={k: v for k, v in missing_requests.items() if v},
        missing_limits={k: v for k, v in missing_limits.items() if v},
        user=user,
        groups=groups,
        application=_application(meta),
    )


def quota_usage(requests: Mapping[str, int], limits: Mapping[str, int]) -> dict[str, int]:
    """Quota names -> amounts a pod consumes (``pods.go`` PodUsageFunc)."""
    usage = {"pods": 1, "count/pods": 1}
    for resource, amount in requests.items():
        usage[f"requests.{resource}"] = amount
        if resource in BOTH_NAMES or resource.startswith(HUGEPAGES):
            usage[resource] = amount
    for resource, amount in limits.items():
        if resource in ("cpu", "memory", "ephemeral-storage"):
            usage[f"limits.{resource}"] = amount
    return dict(sorted(usage.items()))


def usage_of_resources(resources: Mapping[str, int]) -> tuple[dict[str, int], PodScopes]:
    """Quota usage of a plain reservation: its amounts are both requests and limits."""
    requests = {("cpu" if res == "vcore" else res): v for res, v in resources.items() if res != "pods"}
    best_effort = not any(res in requests for res in COMPUTE)
    usage = quota_usage(requests, {res: v for res, v in requests.items() if res in COMPUTE})
    return usage, PodScopes(best_effort=best_effort)


def supports_pod_level(resource: str) -> bool:
    """Whether ``spec.resources`` may set ``resource`` (Kubernetes' supported pod-level resources)."""
    return resource in COMPUTE or resource.startswith(HUGEPAGES)


def _pod_level(value: object) -> tuple[dict[str, int], dict[str, int]]:
    """Pod-level requests and limits of the supported resources (requests default to limits)."""
    if value is None:
        return {}, {}
    resources = _mapping(value, "spec.resources")
    limits = _quantities(_given(resources, "limits", {}), "spec.resources.limits")
    requests = _quantities(_given(resources, "requests", {}), "spec.resources.requests")
    for resource, amount in limits.items():
        requests.setdefault(resource, amount)
    supported = {res: v for res, v in requests.items() if supports_pod_level(res)}
    return supported, {res: v for res, v in limits.items() if supports_pod_level(res)}


def _pod_total(
    containers: Iterable[dict[str, int]],
    inits: Iterable[dict[str, int]],
    pod_level: Mapping[str, int],
    overhead: Mapping[str, int],
) -> dict[str, int]:
    total: dict[str, int] = {}
    for each in containers:
        for resource, amount in each.items():
            total[resource] = total.get(resource, 0) + amount
    for each in inits:
        for resource, amount in each.items():
            total[resource] = max(total.get(resource, 0), amount)
    total.update(pod_level)
    for resource, amount in overhead.items():
        total[resource] = total.get(resource, 0) + amount
    return dict(sorted(total.items()))


def _containers(
    value: object, where: str, *, required: bool
) -> list[tuple[str, dict[str, int], dict[str, int]]]:
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise InvalidRequest(f"{where} must be a list of containers", field=where)
    found = []
    for index, item in enumerate(value):
        path = f"{where}[{index}]"
        container = _mapping(item, path)
        name = container.get("name") or f"#{index}"
        resources = _mapping(_given(container, "resources", {}), f"{path}.resources")
        limits = _quantities(_given(resources, "limits", {}), f"{path}.resources.limits")
        requests = _quantities(_given(resources, "requests", {}), f"{path}.resources.requests")
        for resource, amount in limits.items():
            requests.setdefault(resource, amount)  # API server defaulting: request = limit
        found.append((str(name), requests, limits))
    return found


def _quantities(values: object, where: str) -> dict[str, int]:
    return parse_resources(_mapping(values, where))


def _cross_namespace(affinity: object) -> bool:
    if not isinstance(affinity, Mapping):
        return False
    for kind in ("podAffinity", "podAntiAffinity"):
        block = affinity.get(kind)
        if not isinstance(block, Mapping):
            continue
        terms = list(block.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        terms += [
            t.get("podAffinityTerm") or {}
            for t in block.get("preferredDuringSchedulingIgnoredDuringExecution") or []
            if isinstance(t, Mapping)
        ]
        for term in terms:
            if not isinstance(term, Mapping):
                continue
            if term.get("namespaces") or term.get("namespaceSelector") is not None:
                return True
    return False


def _user_info(meta: Mapping[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    annotations = meta.get("annotations") or {}
    raw = annotations.get(USER_INFO) if isinstance(annotations, Mapping) else None
    if raw is None:
        return None, ()
    info = validation.load_yaml(raw, USER_INFO) if isinstance(raw, str) else None
    if not isinstance(info, Mapping) or not isinstance(info.get("user"), str):
        raise InvalidRequest(f'{USER_INFO} must be {{"user": ..., "groups": [...]}}', field=USER_INFO)
    groups = info.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise InvalidRequest(f"{USER_INFO} groups must be a list of names", field=USER_INFO)
    return info["user"], tuple(groups)


def _application(meta: Mapping[str, Any]) -> str | None:
    for source in (meta.get("labels") or {}, meta.get("annotations") or {}):
        if isinstance(source, Mapping):
            for key in APP_LABELS:
                if isinstance(source.get(key), str) and source[key]:
                    return str(source[key])
    return None


def _given(mapping: Mapping[str, Any], key: str, default: Any) -> Any:
    value = mapping.get(key)
    return default if value is None or value == "" else value


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{where} must be a mapping", field=where)
    return value
