"""ResourceQuota scopes, covering-quota admission and pods as reservations, on every backend."""

from __future__ import annotations

import time
from typing import Any

import pytest

from quota_ledger import (
    InvalidResourceQuota,
    MissingCoveringQuota,
    OverQuota,
    PodMissingResources,
    QuotaEngine,
    ReservationState,
    ResourceQuotaNotFound,
)

_uid = iter(range(1, 10**6))


def pod(
    namespace: str = "team",
    *,
    priority: str | None = None,
    cpu: str = "500m",
    memory: str | None = "1Gi",
    limits: dict[str, str] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    requests = {"cpu": cpu} | ({"memory": memory} if memory else {})
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "x", "resources": resources}]}
    if priority:
        spec["priorityClassName"] = priority
    name = f"p{next(_uid)}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
        "spec": spec,
    }


def quota(
    name: str, namespace: str = "team", hard: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": hard or {"pods": "10"}, **spec},
    }


def by_priority(operator: str, *values: str) -> dict[str, Any]:
    expression: dict[str, Any] = {"scopeName": "PriorityClass", "operator": operator}
    if values:
        expression["values"] = list(values)
    return {"matchExpressions": [expression]}


CRITICAL_ONLY = """
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ResourceQuota
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: ResourceQuotaConfiguration
    limitedResources:
    - resource: pods
      matchScopes:
      - scopeName: PriorityClass
        operator: In
        values: ["cluster-services"]
"""


def test_user_story_1_critical_pods_need_a_covering_quota(ledger: QuotaEngine) -> None:
    ledger.apply_admission_config(CRITICAL_ONLY)
    with pytest.raises(MissingCoveringQuota) as refused:
        ledger.reserve_pod(pod("kube-system", priority="cluster-services"))
    assert refused.value.scopes == ["{PriorityClass In [cluster-services]}"]
    assert "insufficient quota to match these scopes" in str(refused.value)
    ledger.reserve_pod(pod("kube-system", priority="low"))  # not limited: no quota needed
    ledger.apply_resource_quota(
        quota("pods-cluster-services", "kube-system", scopeSelector=by_priority("In", "cluster-services"))
    )
    ledger.reserve_pod(pod("kube-system", priority="cluster-services"))
    assert ledger.resource_quota_status("kube-system", "pods-cluster-services")["used"] == {"pods": "1"}
    with pytest.raises(MissingCoveringQuota):  # a covering quota elsewhere does not count
        ledger.reserve_pod(pod("default", priority="cluster-services"))
    ledger.delete_resource_quota("kube-system", "pods-cluster-services")
    with pytest.raises(MissingCoveringQuota):
        ledger.reserve_pod(pod("kube-system", priority="cluster-services"))
    assert ledger.audit() == []


def test_user_story_2_exists_limits_every_priority_class(ledger: QuotaEngine) -> None:
    ledger.apply_resource_quota(
        quota("prioritized", hard={"pods": "2", "cpu": "10"}, scopeSelector=by_priority("Exists"))
    )
    ledger.reserve_pod(pod(priority="high"))
    ledger.reserve_pod(pod(priority="low"))
    with pytest.raises(OverQuota) as refused:
        ledger.reserve_pod(pod(priority="medium"))
    (violation,) = refused.value.violations
    assert (violation.scope, violation.resource, violation.limit, violation.in_use) == (
        "team/prioritized",
        "pods",
        2,
        2,
    )
    ledger.reserve_pod(pod())  # no priority class: not in scope
    assert ledger.resource_quota_status("team", "prioritized") == {
        "hard": {"cpu": "10", "pods": "2"},
        "used": {"cpu": "1", "pods": "2"},
    }


@pytest.mark.parametrize(
    ("selector", "matching", "other"),
    [
        (by_priority("In", "a"), "a", "b"),
        (by_priority("NotIn", "a"), None, "a"),
        (by_priority("Exists"), "b", None),
        (by_priority("DoesNotExist"), None, "a"),
    ],
)
def test_each_operator_has_a_matching_and_a_non_matching_pod(
    ledger: QuotaEngine, selector: dict[str, Any], matching: str | None, other: str | None
) -> None:
    ledger.apply_resource_quota(quota("q", hard={"pods": "1"}, scopeSelector=selector))
    ledger.reserve_pod(pod(priority=matching))
    with pytest.raises(OverQuota):
        ledger.reserve_pod(pod(priority=matching))
    ledger.reserve_pod(pod(priority=other))


@pytest.mark.parametrize(
    ("scope", "matching", "other"),
    [
        ("Terminating", {"activeDeadlineSeconds": 60}, {}),
        ("NotTerminating", {}, {"activeDeadlineSeconds": 60}),
        ("BestEffort", {"containers": [{"name": "a"}]}, {}),
        ("NotBestEffort", {}, {"containers": [{"name": "a"}]}),
        (
            "CrossNamespacePodAffinity",
            {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "zone", "namespaces": ["other"]}
                        ]
                    }
                }
            },
            {},
        ),
    ],
)
def test_each_scope_has_a_matching_and_a_non_matching_pod(
    ledger: QuotaEngine, scope: str, matching: dict[str, Any], other: dict[str, Any]
) -> None:
    ledger.apply_resource_quota(quota("q", hard={"pods": "1"}, scopes=[scope]))

    def shaped(extra: dict[str, Any]) -> dict[str, Any]:
        made = pod()
        made["spec"].update(extra)
        return made

    ledger.reserve_pod(shaped(matching))
    with pytest.raises(OverQuota):
        ledger.reserve_pod(shaped(matching))
    ledger.reserve_pod(shaped(other))


def test_a_pod_must_fit_every_matching_quota_and_one_misfit_charges_none(ledger: QuotaEngine) -> None:
    ledger.apply_resource_quota(quota("pods", hard={"pods": "10"}))
    ledger.apply_resource_quota(quota("cpu", hard={"requests.cpu": "1"}))
    ledger.reserve_pod(pod(cpu="1"))  # equality with hard is allowed
    with pytest.raises(OverQuota) as refused:
        ledger.reserve_pod(pod(cpu="1m"))
    assert [(v.kind, v.scope, v.resource) for v in refused.value.violations] == [
        ("quota", "team/cpu", "requests.cpu")
    ]
    assert ledger.resource_quota_status("team", "pods")["used"] == {"pods": "1"}


def test_quota_update_applies_at_once_and_counts_existing_pods(ledger: QuotaEngine) -> None:
    ledger.reserve_pod(pod(cpu="2"))
    ledger.reserve_pod(pod(cpu="1"))
    status = ledger.apply_resource_quota(quota("cpu", hard={"requests.cpu": "3"}))
    assert status["used"] == {"requests.cpu": "3"}
    with pytest.raises(OverQuota):
        ledger.reserve_pod(pod(cpu="100m"))
    ledger.apply_resource_quota(quota("cpu", hard={"requests.cpu": "4", "pods": "3"}))
    assert ledger.resource_quota_status("team", "cpu")["used"] == {"pods": "2", "requests.cpu": "3"}
    ledger.reserve_pod(pod(cpu="1"))
    with pytest.raises(OverQuota):
        ledger.reserve_pod(pod(cpu="1m"))
    ledger.delete_resource_quota("team", "cpu")
    with pytest.raises(ResourceQuotaNotFound):
        ledger.resource_quota_status("team", "cpu")
    ledger.reserve_pod(pod(cpu="1"))
    assert ledger.audit() == []


def test_status_follows_rollback_commit_release_and_expiry(ledger: QuotaEngine) -> None:
    ledger.apply_resource_quota(quota("q", hard={"pods": "5", "requests.memory": "10Gi"}))
    first, second, third = pod(), pod(), pod()
    r1 = ledger.reserve_pod(first, ttl=600)
    r2 = ledger.reserve_pod(second, ttl=600)
    ledger.reserve_pod(third, ttl=0.05)
    assert ledger.resource_quota_status("team", "q")["used"] == {"pods": "3", "requests.memory": "3Gi"}
    ledger.commit(r1.id)  # commit changes nothing: a pod counts from admission to deletion
    ledger.rollback(r2.id)
    time.sleep(0.1)
    assert ledger.expire() == 1
    assert ledger.resource_quota_status("team", "q")["used"] == {"pods": "1", "requests.memory": "1Gi"}
    released = ledger.release_pod(first)
    assert released.released_at is not None
    assert ledger.release_pod(first).released_at == released.released_at  # once
    assert ledger.resource_quota_status("team", "q")["used"] == {"pods": "0", "requests.memory": "0"}
    assert ledger.usage("root.team")["pods"].in_use == 0
    assert ledger.audit() == []


def test_the_pod_uid_is_the_idempotency_key(ledger: QuotaEngine) -> None:
    ledger.apply_resource_quota(quota("q", hard={"pods": "5"}))
    made = pod(uid="6f1c")
    first = ledger.reserve_pod(made)
    again = ledger.reserve_pod(made)
    assert again.id == first.id
    assert first.key == "6f1c"
    assert ledger.resource_quota_status("team", "q")["used"] == {"pods": "1"}


def test_quantities_round_trip_through_status(ledger: QuotaEngine) -> None:
    hard = {"limits.memory": "1.5Gi", "requests.cpu": "250m", "pods": "1e3", "cpu": "0.1m"}
    status = ledger.apply_resource_quota(quota("q", hard=hard))
    assert status["hard"] == {"cpu": "1m", "limits.memory": "1536Mi", "pods": "1k", "requests.cpu": "250m"}
    assert status["used"] == {"cpu": "0", "limits.memory": "0", "pods": "0", "requests.cpu": "0"}


def test_a_pod_without_a_tracked_limit_is_refused_naming_the_containers(ledger: QuotaEngine) -> None:
    ledger.apply_resource_quota(quota("mem", hard={"limits.memory": "4Gi"}))
    with pytest.raises(PodMissingResources) as refused:
        ledger.reserve_pod(pod())
    assert refused.value.missing == {"limits.memory": ["app"]}
    assert "must specify limits.memory for: app" in str(refused.value)
    ledger.reserve_pod(pod(limits={"memory": "2Gi"}))
    assert ledger.resource_quota_status("team", "mem")["used"] == {"limits.memory": "2Gi"}


def test_plain_reservations_use_the_scope_keywords(ledger: QuotaEngine) -> None:
    ledger.apply_resource_quota(quota("high", hard={"cpu": "1"}, scopeSelector=by_priority("In", "high")))
    ledger.reserve("root.team", {"vcore": "1"}, priority_class="high")
    with pytest.raises(OverQuota):
        ledger.reserve("root.team", {"vcore": "1"}, priority_class="high")
    ledger.reserve("root.team", {"vcore": "1"}, priority_class="low")
    assert ledger.resource_quota_status("team", "high")["used"] == {"cpu": "1"}


def test_namespace_placement_moves_its_quotas(ledger: QuotaEngine) -> None:
    ledger.apply_namespace(
        {
            "kind": "Namespace",
            "metadata": {"name": "team", "annotations": {"yunikorn.apache.org/parentqueue": "root.org"}},
        }
    )
    ledger.apply_resource_quota(quota("q", hard={"pods": "1"}))
    made = ledger.reserve_pod(pod())
    assert made.queue == "root.org.team"
    with pytest.raises(OverQuota):
        ledger.reserve_pod(pod())


def test_invalid_quota_changes_nothing(ledger: QuotaEngine) -> None:
    version = ledger.config_version()
    with pytest.raises(InvalidResourceQuota) as refused:
        ledger.apply_resource_quota(quota("bad", hard={"cpu": "1"}, scopes=["BestEffort"]))
    assert refused.value.field == "spec.hard[cpu]"
    assert ledger.config_version() == version
    with pytest.raises(ResourceQuotaNotFound):
        ledger.delete_resource_quota("team", "bad")


def test_referential_integrity_is_not_enforced(ledger: QuotaEngine) -> None:
    ledger.apply_resource_quota(
        quota("ghost", hard={"pods": "1"}, scopeSelector=by_priority("In", "no-such-class"))
    )
    made = ledger.reserve_pod(pod(priority="no-such-class"))
    assert made.state is ReservationState.PENDING
