"""Kubernetes' pod evaluator, pkg/quota/v1/evaluator/core/pods_test.go (kubernetes/kubernetes).

TestPodEvaluatorUsage: the quota usage of each pod (amounts in the ledger's units: milli-cores
for the cpu names, whole bytes or counts for the rest, rounded up as upstream's ``Value()`` and
``MilliValue()`` round). TestPodConstraintsFunc: which containers a quota on cpu or memory
finds wanting, word for word. TestPodEvaluatorMatchingScopes: which scope selectors a pod
matches. Upstream's pods without containers get one container with no resources, since the
ledger, like the API server, requires one; it changes no amount and no scope (for the
constraints, it sets every value the quota demands, so it is never the one found wanting).
"""

from __future__ import annotations

from typing import Any

import pytest
from upstream_cases import agree

from quota_ledger.config.rules import PartitionRules
from quota_ledger.kube import quotas
from quota_ledger.kube.pods import parse_pod
from quota_ledger.kube.quotas import Requirement
from quota_ledger.ledger.resource_quotas import admit
from quota_ledger.model.errors import PodMissingResources
from quota_ledger.model.quantity import parse_quantity

FILE = "pkg/quota/v1/evaluator/core/pods_test.go"
PHASES = "the ledger counts live reservations, not pod phases: a finished pod is released, not re-evaluated"


def c(
    name: str | None = None, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None
) -> dict[str, Any]:
    """A container; upstream's unnamed containers stay unnamed."""
    container: dict[str, Any] = {"resources": {}}
    if name is not None:
        container["name"] = name
    if requests:
        container["resources"]["requests"] = requests
    if limits:
        container["resources"]["limits"] = limits
    return container


def pod(
    containers: list[dict[str, Any]] | None = None,
    inits: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": containers or [c("placeholder")], **spec}
    if inits:
        body["initContainers"] = inits
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": body}


def counted(**usage: str) -> dict[str, int]:
    """Upstream's expected usage (quota name -> quantity) in the ledger's units, with the pod counts."""
    found = {"pods": 1, "count/pods": 1}
    for name, text in usage.items():
        resource = (
            name.replace("__", "/")
            .replace("_", "-")
            .replace("requests-", "requests.")
            .replace("limits-", "limits.")
        )
        found[resource] = parse_quantity("cpu" if resource.endswith("cpu") else "memory", text)
    return found


HUGE = "hugepages-2Mi"
USAGE = {
    "init container CPU": (
        pod(inits=[c(requests={"cpu": "1m"}, limits={"cpu": "2m"})]),
        counted(requests_cpu="1m", limits_cpu="2m", cpu="1m"),
    ),
    "init container MEM": (
        pod(inits=[c(requests={"memory": "1m"}, limits={"memory": "2m"})]),
        counted(requests_memory="1m", limits_memory="2m", memory="1m"),
    ),
    "init container local ephemeral storage": (
        pod(inits=[c(requests={"ephemeral-storage": "32Mi"}, limits={"ephemeral-storage": "64Mi"})]),
        counted(ephemeral_storage="32Mi", requests_ephemeral_storage="32Mi", limits_ephemeral_storage="64Mi"),
    ),
    "init container hugepages": (
        pod(inits=[c(requests={HUGE: "100Mi"})]),
        {**counted(), HUGE: 100 * 2**20, f"requests.{HUGE}": 100 * 2**20},
    ),
    "init container extended resources": (
        pod(inits=[c(requests={"example.com/dongle": "3"}, limits={"example.com/dongle": "3"})]),
        {**counted(), "requests.example.com/dongle": 3},
    ),
    "container CPU": (
        pod([c(requests={"cpu": "1m"}, limits={"cpu": "2m"})]),
        counted(requests_cpu="1m", limits_cpu="2m", cpu="1m"),
    ),
    "container MEM": (
        pod([c(requests={"memory": "1m"}, limits={"memory": "2m"})]),
        counted(requests_memory="1m", limits_memory="2m", memory="1m"),
    ),
    "container local ephemeral storage": (
        pod([c(requests={"ephemeral-storage": "32Mi"}, limits={"ephemeral-storage": "64Mi"})]),
        counted(ephemeral_storage="32Mi", requests_ephemeral_storage="32Mi", limits_ephemeral_storage="64Mi"),
    ),
    "container hugepages": (
        pod([c(requests={HUGE: "100Mi"})]),
        {**counted(), HUGE: 100 * 2**20, f"requests.{HUGE}": 100 * 2**20},
    ),
    "container extended resources": (
        pod([c(requests={"example.com/dongle": "3"}, limits={"example.com/dongle": "3"})]),
        {**counted(), "requests.example.com/dongle": 3},
    ),
    "terminated generic count still appears": (
        {
            **pod([c(requests={"example.com/dongle": "3"}, limits={"example.com/dongle": "3"})]),
            "status": {"phase": "Succeeded"},
        },
        {"count/pods": 1},
    ),
    "init container maximums override sum of containers": (
        pod(
            [
                c(
                    requests={"cpu": "1", "memory": "50M", "example.com/dongle": "1"},
                    limits={"cpu": "2", "memory": "100M", "example.com/dongle": "1"},
                ),
                c(
                    requests={"cpu": "2", "memory": "25M", "example.com/dongle": "2"},
                    limits={"cpu": "5", "memory": "50M", "example.com/dongle": "2"},
                ),
            ],
            [
                c(
                    requests={"cpu": "4", "memory": "100M", "example.com/dongle": "4"},
                    limits={"cpu": "8", "memory": "200M", "example.com/dongle": "4"},
                ),
                c(
                    requests={"cpu": "1", "memory": "50M", "example.com/dongle": "2"},
                    limits={"cpu": "2", "memory": "100M", "example.com/dongle": "2"},
                ),
            ],
        ),
        {
            **counted(
                requests_cpu="4",
                requests_memory="100M",
                limits_cpu="8",
                limits_memory="200M",
                cpu="4",
                memory="100M",
            ),
            "requests.example.com/dongle": 4,
        },
    ),
    "pod deletion timestamp exceeded": (
        {
            **pod(
                [c(requests={"cpu": "1", "memory": "50M"}, limits={"cpu": "2", "memory": "100M"})],
                terminationGracePeriodSeconds=30,
            ),
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "deletionTimestamp": "2000-01-01T00:00:00Z",
                "deletionGracePeriodSeconds": 30,
            },
            "status": {"reason": "NodeLost"},
        },
        {"count/pods": 1},
    ),
    "pod deletion timestamp not exceeded": (
        {
            **pod([c(requests={"cpu": "1"}, limits={"cpu": "2"})]),
            "metadata": {"name": "p", "namespace": "ns", "deletionGracePeriodSeconds": 30},
            "status": {"reason": "NodeLost"},
        },
        counted(requests_cpu="1", limits_cpu="2", cpu="1"),
    ),
    "count pod overhead as usage": (
        pod([c(requests={"cpu": "1"}, limits={"cpu": "2"})], overhead={"cpu": "1"}),
        counted(requests_cpu="2", limits_cpu="3", cpu="2"),
    ),
    "pod-level CPU": (
        pod(resources={"requests": {"cpu": "1m"}, "limits": {"cpu": "2m"}}),
        counted(requests_cpu="1m", limits_cpu="2m", cpu="1m"),
    ),
    "pod-level Memory": (
        pod(resources={"requests": {"memory": "1Mi"}, "limits": {"memory": "2Mi"}}),
        counted(requests_memory="1Mi", limits_memory="2Mi", memory="1Mi"),
    ),
    "pod-level memory with container-level ephemeral storage": (
        pod(
            [c(requests={"ephemeral-storage": "32Mi"}, limits={"ephemeral-storage": "64Mi"})],
            resources={"requests": {"memory": "1Mi"}, "limits": {"memory": "2Mi"}},
        ),
        counted(
            ephemeral_storage="32Mi",
            requests_ephemeral_storage="32Mi",
            limits_ephemeral_storage="64Mi",
            requests_memory="1Mi",
            limits_memory="2Mi",
            memory="1Mi",
        ),
    ),
}
USAGE_DIFFERS = {"terminated generic count still appears": PHASES, "pod deletion timestamp exceeded": PHASES}


@pytest.mark.parametrize(
    ("manifest", "usage", "reason"),
    [
        pytest.param(
            m,
            u,
            USAGE_DIFFERS.get(name),
            id=f"TestPodEvaluatorUsage-{name}{'-differs' if name in USAGE_DIFFERS else ''}",
        )
        for name, (m, u) in USAGE.items()
    ],
)
def test_pod_usage(manifest: dict[str, Any], usage: dict[str, int], reason: str | None) -> None:
    found = parse_pod(manifest).usage
    agree(found == usage, reason, (FILE, "TestPodEvaluatorUsage", found, usage))


#: the container an init-only pod gets here: it sets every value a quota can demand
COMPLETE = c("placeholder", {"cpu": "1m", "memory": "1"}, {"cpu": "1m", "memory": "1"})
CONSTRAINTS = {
    "init container resource missing": (
        pod([COMPLETE], [c("dummy", {"cpu": "1m"}, {"cpu": "2m"})]),
        ["memory"],
        "must specify memory for: dummy",
    ),
    "multiple init container resource missing": (
        pod([COMPLETE], [c("foo", {"cpu": "1m"}, {"cpu": "2m"}), c("bar", {"cpu": "1m"}, {"cpu": "2m"})]),
        ["memory"],
        "must specify memory for: bar,foo",
    ),
    "container resource missing": (
        pod([c("dummy", {"cpu": "1m"}, {"cpu": "2m"})]),
        ["memory"],
        "must specify memory for: dummy",
    ),
    "multiple container resource missing": (
        pod([c("foo", {"cpu": "1m"}, {"cpu": "2m"}), c("bar", {"cpu": "1m"}, {"cpu": "2m"})]),
        ["memory"],
        "must specify memory for: bar,foo",
    ),
    "container resource missing multiple": (
        pod([c("foo"), c("bar")]),
        ["memory", "cpu"],
        "must specify cpu for: bar,foo; memory for: bar,foo",
    ),
    "pod-level resource set, container-level required resources missing": (
        pod([c("foo"), c("bar")], resources={"requests": {"cpu": "1m"}}),
        ["memory", "cpu"],
        "",
    ),
}


@pytest.mark.parametrize(
    ("manifest", "required", "error"),
    [pytest.param(*row, id=f"TestPodConstraintsFunc-{name}") for name, row in CONSTRAINTS.items()],
)
def test_pod_constraints(manifest: dict[str, Any], required: list[str], error: str) -> None:
    request = parse_pod(manifest)
    quota = quotas.parse(
        {
            "kind": "ResourceQuota",
            "metadata": {"name": "quota", "namespace": "ns"},
            "spec": {"hard": {r: "1" for r in required}},
        }
    )
    rules = PartitionRules("default", quotas={"root.ns": (quota,)})
    kube = {"scopes": request.scopes.as_dict(), "usage": request.usage}
    missing = {"requests": request.missing_requests, "limits": request.missing_limits}
    if not error:
        assert admit(rules, "root.ns", "ns", kube, missing) == [quota]
        return
    with pytest.raises(PodMissingResources) as caught:
        admit(rules, "root.ns", "ns", kube, missing)
    assert str(caught.value) == f"failed quota: ns/quota: {error}"


ALL_SELECTORS = [
    Requirement("Terminating", "Exists"),
    Requirement("NotTerminating", "Exists"),
    Requirement("BestEffort", "Exists"),
    Requirement("NotBestEffort", "Exists"),
    Requirement("PriorityClass", "In", ("class1",)),
    Requirement("CrossNamespacePodAffinity", "Exists"),
]
TERMINATING = {"activeDeadlineSeconds": 30}


def affinity(kind: str, required: bool, term: dict[str, Any]) -> dict[str, Any]:
    if required:
        return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {
        kind: {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": term}]}
    }


MATCHING = {
    "EmptyPod": (pod(), None, ["NotTerminating", "BestEffort"]),
    "PriorityClass": (
        pod(priorityClassName="class1"),
        None,
        ["NotTerminating", "BestEffort", "PriorityClass"],
    ),
    "NotBestEffort": (
        pod(
            [
                c(
                    requests={"cpu": "1", "memory": "50M", "example.com/dongle": "1"},
                    limits={"cpu": "2", "memory": "100M", "example.com/dongle": "1"},
                )
            ]
        ),
        None,
        ["NotTerminating", "NotBestEffort"],
    ),
    "Terminating": (pod(**TERMINATING), None, ["Terminating", "BestEffort"]),
    "OnlyTerminating": (pod(**TERMINATING), [Requirement("Terminating", "Exists")], ["Terminating"]),
    "CrossNamespaceRequiredAffinity": (
        pod(
            **TERMINATING,
            affinity=affinity(
                "podAffinity", True, {"labelSelector": {}, "namespaces": ["ns1"], "namespaceSelector": {}}
            ),
        ),
        None,
        ["Terminating", "BestEffort", "CrossNamespacePodAffinity"],
    ),
    "CrossNamespaceRequiredAffinityWithSlice": (
        pod(
            **TERMINATING,
            affinity=affinity("podAffinity", True, {"labelSelector": {}, "namespaces": ["ns1"]}),
        ),
        None,
        ["Terminating", "BestEffort", "CrossNamespacePodAffinity"],
    ),
    "CrossNamespacePreferredAffinity": (
        pod(
            **TERMINATING,
            affinity=affinity(
                "podAffinity", False, {"labelSelector": {}, "namespaces": ["ns2"], "namespaceSelector": {}}
            ),
        ),
        None,
        ["Terminating", "BestEffort", "CrossNamespacePodAffinity"],
    ),
    "CrossNamespacePreferredAffinityWithSelector": (
        pod(
            **TERMINATING,
            affinity=affinity("podAffinity", False, {"labelSelector": {}, "namespaceSelector": {}}),
        ),
        None,
        ["Terminating", "BestEffort", "CrossNamespacePodAffinity"],
    ),
    "CrossNamespacePreferredAntiAffinity": (
        pod(
            **TERMINATING,
            affinity=affinity("podAntiAffinity", False, {"labelSelector": {}, "namespaceSelector": {}}),
        ),
        None,
        ["Terminating", "BestEffort", "CrossNamespacePodAffinity"],
    ),
    "CrossNamespaceRequiredAntiAffinity": (
        pod(
            **TERMINATING,
            affinity=affinity("podAntiAffinity", True, {"labelSelector": {}, "namespaces": ["ns3"]}),
        ),
        None,
        ["Terminating", "BestEffort", "CrossNamespacePodAffinity"],
    ),
}


@pytest.mark.parametrize(
    ("manifest", "selectors", "wanted"),
    [pytest.param(*row, id=f"TestPodEvaluatorMatchingScopes-{name}") for name, row in MATCHING.items()],
)
def test_pod_matching_scopes(
    manifest: dict[str, Any], selectors: list[Requirement] | None, wanted: list[str]
) -> None:
    scopes = parse_pod(manifest).scopes
    matched = [r.scope for r in (selectors or ALL_SELECTORS) if r.matches(scopes)]
    assert matched == wanted
