"""Pods and ResourceQuotas parsed and matched as Kubernetes does: pure, no database."""

from __future__ import annotations

from typing import Any

import pytest

from quota_ledger import InvalidQuantity, InvalidResourceQuota
from quota_ledger.kube import admission
from quota_ledger.kube.pods import PodScopes, parse_pod
from quota_ledger.kube.quotas import Requirement, hard_value, parse


def _pod(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"containers": [{"name": "app", "resources": {"requests": {"cpu": "250m"}}}]}
    base.update(spec)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": base,
    }


def test_pod_request_sums_containers_takes_the_largest_init_container_and_adds_overhead() -> None:
    pod = _pod(
        containers=[
            {
                "name": "a",
                "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
            },
            {"name": "b", "resources": {"requests": {"cpu": "500m", "nvidia.com/gpu": "1"}}},
        ],
        initContainers=[{"name": "init", "resources": {"requests": {"cpu": "2", "memory": "512Mi"}}}],
        overhead={"cpu": "100m", "memory": "64Mi"},
    )
    request = parse_pod(pod)
    assert request.resources == {"memory": 2**30 + 64 * 2**20, "nvidia.com/gpu": 1, "pods": 1, "vcore": 2100}
    assert request.usage["requests.cpu"] == 2100
    assert request.usage["cpu"] == 2100
    assert request.usage["limits.memory"] == 2 * 2**30 + 64 * 2**20
    assert request.usage["requests.nvidia.com/gpu"] == 1
    assert request.usage["pods"] == request.usage["count/pods"] == 1
    assert request.missing_limits == {"cpu": ["a", "b", "init"], "memory": ["b", "init"]}
    assert request.missing_requests == {"memory": ["b"]}


def test_a_limit_without_a_request_requests_the_limit() -> None:
    request = parse_pod(_pod(containers=[{"name": "a", "resources": {"limits": {"cpu": "1"}}}]))
    assert request.usage["requests.cpu"] == 1000
    assert request.usage["limits.cpu"] == 1000


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, PodScopes(best_effort=False)),
        ({"containers": [{"name": "a"}]}, PodScopes(best_effort=True)),
        ({"activeDeadlineSeconds": 0}, PodScopes(terminating=True)),
        ({"priorityClassName": "high"}, PodScopes(priority_class="high")),
        (
            {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "k", "namespaceSelector": {}}
                        ]
                    }
                }
            },
            PodScopes(cross_namespace_affinity=True),
        ),
        (
            {
                "affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 1, "podAffinityTerm": {"topologyKey": "k", "namespaces": ["other"]}}
                        ]
                    }
                }
            },
            PodScopes(cross_namespace_affinity=True),
        ),
        (
            {
                "affinity": {
                    "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "k"}]}
                }
            },
            PodScopes(),
        ),
    ],
)
def test_scope_attributes(spec: dict[str, Any], expected: PodScopes) -> None:
    assert parse_pod(_pod(**spec)).scopes == expected


NONE, A, B = PodScopes(), PodScopes(priority_class="a"), PodScopes(priority_class="b")


@pytest.mark.parametrize(
    ("operator", "values", "matches"),
    [
        ("Exists", (), (False, True, True)),
        ("DoesNotExist", (), (True, False, False)),
        ("In", ("a",), (False, True, False)),
        ("NotIn", ("a",), (True, False, True)),  # NotIn matches a pod with no priority class
    ],
)
def test_priority_class_truth_table(
    operator: str, values: tuple[str, ...], matches: tuple[bool, ...]
) -> None:
    requirement = Requirement("PriorityClass", operator, values)
    assert tuple(requirement.matches(pod) for pod in (NONE, A, B)) == matches


@pytest.mark.parametrize(
    ("scope", "pod", "expected"),
    [
        ("Terminating", PodScopes(terminating=True), True),
        ("Terminating", PodScopes(), False),
        ("NotTerminating", PodScopes(), True),
        ("NotTerminating", PodScopes(terminating=True), False),
        ("BestEffort", PodScopes(best_effort=True), True),
        ("BestEffort", PodScopes(), False),
        ("NotBestEffort", PodScopes(), True),
        ("NotBestEffort", PodScopes(best_effort=True), False),
        ("CrossNamespacePodAffinity", PodScopes(cross_namespace_affinity=True), True),
        ("CrossNamespacePodAffinity", PodScopes(), False),
    ],
)
def test_other_scopes(scope: str, pod: PodScopes, expected: bool) -> None:
    assert Requirement(scope, "Exists").matches(pod) is expected


def _quota(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q", "namespace": "ns"},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"hard": {"pods": "1"}, "scopes": ["Forever"]}, "spec.scopes[0]", "unsupported scope"),
        (
            {
                "hard": {"pods": "1"},
                "scopeSelector": {
                    "matchExpressions": [{"scopeName": "BestEffort", "operator": "In", "values": ["x"]}]
                },
            },
            "spec.scopeSelector.matchExpressions[0].operator",
            "must be 'Exists'",
        ),
        (
            {
                "hard": {"pods": "1"},
                "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In"}]},
            },
            "spec.scopeSelector.matchExpressions[0].values",
            "must be at least one value",
        ),
        (
            {
                "hard": {"pods": "1"},
                "scopeSelector": {
                    "matchExpressions": [
                        {"scopeName": "PriorityClass", "operator": "Exists", "values": ["a"]}
                    ]
                },
            },
            "spec.scopeSelector.matchExpressions[0].values",
            "must be no value",
        ),
        (
            {
                "hard": {"pods": "1"},
                "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "Has"}]},
            },
            "spec.scopeSelector.matchExpressions[0].operator",
            "not a valid selector operator",
        ),
        (
            {"hard": {"pods": "1"}, "scopes": ["BestEffort", "NotBestEffort"]},
            "spec.scopes",
            "conflicting scopes",
        ),
        (
            {"hard": {"pods": "1"}, "scopes": ["Terminating", "NotTerminating"]},
            "spec.scopes",
            "conflicting scopes",
        ),
        (
            {"hard": {"cpu": "1"}, "scopes": ["BestEffort"]},
            "spec.hard[cpu]",
            "unsupported scope applied to resource",
        ),
        ({"hard": {"services": "1"}, "scopes": ["Terminating"]}, "spec.hard[services]", "unsupported scope"),
        ({"hard": {"pods": "-1"}}, "spec.hard[pods]", "greater than or equal to 0"),
        ({"hard": {"pods": "1.5"}}, "spec.hard[pods]", "must be an integer"),
        (
            {"hard": {"requests.nvidia.com/gpu": "500m"}},
            "spec.hard[requests.nvidia.com/gpu]",
            "must be an integer",
        ),
        ({"hard": {"memory": "lots"}}, "spec.hard[memory]", ""),
    ],
)
def test_quota_validation_names_the_field(spec: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(InvalidResourceQuota) as refused:
        parse(_quota(spec))
    assert any(f == field and message in m for f, m in refused.value.errors), refused.value.errors


@pytest.mark.parametrize(
    "spec",
    [
        {"hard": {"pods": "10", "requests.cpu": "1"}, "scopes": ["BestEffort"]} | {"hard": {"pods": "10"}},
        {"hard": {"cpu": "1", "memory": "1Gi"}, "scopes": ["NotBestEffort", "Terminating"]},
        {"hard": {"requests.nvidia.com/gpu": "4", "count/pods": "3"}, "scopes": ["Terminating"]},
        {
            "hard": {"pods": "1"},
            "scopeSelector": {
                "matchExpressions": [
                    {"scopeName": "PriorityClass", "operator": "NotIn", "values": ["a", "b"]},
                    {"scopeName": "CrossNamespacePodAffinity", "operator": "Exists"},
                ]
            },
        },
    ],
)
def test_valid_quotas_are_accepted(spec: dict[str, Any]) -> None:
    assert parse(_quota(spec)).key == "ns/q"


def test_quantities_in_ledger_units() -> None:
    assert hard_value("requests.cpu", "250m") == 250
    assert hard_value("cpu", "0.1m") == 1  # the ledger counts whole milli-cores, rounding up
    assert hard_value("memory", "1.5Gi") == 1610612736
    assert hard_value("pods", "1e3") == 1000


def test_a_quota_matches_only_when_it_limits_something_a_pod_consumes() -> None:
    services = parse(_quota({"hard": {"services": "1"}}))
    assert not services.matches(PodScopes())
    pods = parse(_quota({"hard": {"pods": "1", "services": "1"}}))
    assert pods.tracked() == ["pods"]
    assert pods.matches(PodScopes())


def test_covering_scopes_compare_scope_names_only() -> None:
    config = admission.parse(
        {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": [
                {
                    "name": "ResourceQuota",
                    "configuration": {
                        "kind": "ResourceQuotaConfiguration",
                        "limitedResources": [
                            {
                                "resource": "pods",
                                "matchScopes": [
                                    {
                                        "scopeName": "PriorityClass",
                                        "operator": "In",
                                        "values": ["cluster-services"],
                                    }
                                ],
                            }
                        ],
                    },
                }
            ],
        }
    )
    pod = PodScopes(priority_class="cluster-services")
    other = parse(
        _quota(
            {
                "hard": {"pods": "1"},
                "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "Exists"}]},
            }
        )
    )
    assert admission.uncovered(config, pod, {"pods": 1}, []) == ([], [config.limited[0].match_scopes[0]])
    assert admission.uncovered(config, pod, {"pods": 1}, [other]) == ([], [])
    assert admission.uncovered(config, PodScopes(priority_class="low"), {"pods": 1}, []) == ([], [])


def test_covering_resources_by_substring() -> None:
    config = admission.parse(
        {
            "kind": "ResourceQuotaConfiguration",
            "limitedResources": [{"resource": "pods", "matchContains": ["cpu"]}],
        }
    )
    usage = {"pods": 1, "requests.cpu": 100, "cpu": 100, "limits.cpu": 100}
    assert admission.uncovered(config, PodScopes(), usage, [])[0] == ["cpu", "limits.cpu", "requests.cpu"]
    cpu_quota = parse(_quota({"hard": {"requests.cpu": "1"}}))
    assert admission.uncovered(config, PodScopes(), usage, [cpu_quota])[0] == ["cpu", "limits.cpu"]


def test_admission_config_needs_a_resource() -> None:
    with pytest.raises(InvalidResourceQuota) as refused:
        admission.parse(
            {"kind": "ResourceQuotaConfiguration", "limitedResources": [{"matchContains": ["cpu"]}]}
        )
    assert refused.value.errors[0][0] == "limitedResources[0].resource"


@pytest.mark.parametrize(
    "spec",
    [
        {"overhead": {"applications": "1"}},
        {"containers": [{"name": "c", "resources": {"requests": {"applications": "1"}}}]},
    ],
)
def test_a_pod_may_not_name_the_running_applications_counter(spec: dict[str, Any]) -> None:
    # The ledger counts running applications under that name: a pod charging it would skew them.
    with pytest.raises(InvalidQuantity, match="reserved resource name"):
        parse_pod(_pod(**spec))
