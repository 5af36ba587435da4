"""Kubernetes' ResourceQuota admission plugin, TestAdmitLimitedScopeWithCoverQuota in
plugin/pkg/admission/resourcequota/admission_test.go (kubernetes/kubernetes).

Each case sets the plugin's ``limitedResources``, creates the namespace's quotas and admits a
pod, on the ledger (SQLite: nothing here is backend-specific). A refusal must be the same kind
(a missing covering quota, or a quota exceeded) and name the same resources or scopes, which
the ledger prints as Kubernetes does. Upstream keeps a quota's ``hard`` in its status; here it
is the spec's, which the API server copies there. Upstream's ``used`` is not carried over: the
ledger counts what it admitted itself, and no case depends on it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quota_ledger import MissingCoveringQuota, OverQuota, QuotaEngine


@pytest.fixture
def ledger(sqlite_template: Path, tmp_path: Path) -> Iterator[QuotaEngine]:
    path = tmp_path / "ledger.db"
    shutil.copy(sqlite_template, path)
    engine = QuotaEngine.from_url(f"sqlite:///{path}")
    yield engine
    engine.close()


def pod(name: str, cpu: str, memory: str, priority: str) -> dict[str, Any]:
    """upstream's ``validPodWithPriority(name, 1, requests(cpu, memory), priority)``."""
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    container: dict[str, Any] = {
        "name": "c0",
        "image": "foo:V0",
        "resources": {"requests": requests} if requests else {},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "test"},
        "spec": {"containers": [container], "priorityClassName": priority},
    }


def scope(name: str, operator: str = "Exists", values: list[str] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"scopeName": name, "operator": operator}
    if values:
        found["values"] = values
    return found


def quota(
    name: str,
    *,
    selector: dict[str, Any] | None = None,
    scopes: list[str] | None = None,
    hard: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if selector is not None:
        spec["scopeSelector"] = {"matchExpressions": [selector]}
    if scopes:
        spec["scopes"] = scopes
    if hard:
        spec["hard"] = hard
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": "test"},
        "spec": spec,
    }


def limited(*entries: tuple[list[dict[str, Any]], list[str]]) -> dict[str, Any]:
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "ResourceQuotaConfiguration",
        "limitedResources": [
            {"resource": "pods", "matchScopes": s, **({"matchContains": c} if c else {})} for s, c in entries
        ],
    }


PC_EXISTS = scope("PriorityClass")
PC_IN_CS = scope("PriorityClass", "In", ["cluster-services"])
PC_IN_BOTH = scope("PriorityClass", "In", ["another-priorityclass-name", "cluster-services"])
BEST_EFFORT = scope("BestEffort")
BE_QUOTA = quota("quota-besteffort", scopes=["BestEffort"], hard={"pods": "5"})
TWO = limited(([BEST_EFFORT], []), ([PC_IN_CS], []))
CASES = [
    (
        "Covering quota exists for configured limited scope PriorityClassNameExists.",
        pod("allowed-pod", "3", "2Gi", "fake-priority"),
        [quota("quota", selector=PC_EXISTS)],
        limited(([PC_EXISTS], [])),
        "",
    ),
    (
        "configured limited scope PriorityClassNameExists and limited cpu resource. No covering quota for "
        "cpu and pod admit fails.",
        pod("not-allowed-pod", "3", "2Gi", "fake-priority"),
        [quota("quota", selector=PC_EXISTS)],
        limited(([PC_EXISTS], ["requests.cpu"])),
        "insufficient quota to consume: requests.cpu",
    ),
    (
        "Covering quota does not exist for configured limited scope PriorityClassNameExists.",
        pod("not-allowed-pod", "3", "2Gi", "fake-priority"),
        [],
        limited(([PC_EXISTS], [])),
        "insufficient quota to match these scopes: [{PriorityClass Exists []}]",
    ),
    (
        "Covering quota does not exist for configured limited scope resourceQuotaBestEffort",
        pod("not-allowed-pod", "", "", "fake-priority"),
        [],
        limited(([BEST_EFFORT], [])),
        "insufficient quota to match these scopes: [{BestEffort Exists []}]",
    ),
    (
        "Covering quota exist for configured limited scope resourceQuotaBestEffort",
        pod("allowed-pod", "", "", "fake-priority"),
        [BE_QUOTA],
        limited(([BEST_EFFORT], [])),
        "",
    ),
    (
        "Two scopes,BestEffort and PriorityClassIN, in two LimitedResources. Neither matches pod. Pod "
        "allowed",
        pod("allowed-pod", "100m", "1Gi", "fake-priority"),
        [],
        TWO,
        "",
    ),
    (
        "Two scopes,BestEffort and PriorityClassIN, in two LimitedResources. Only BestEffort scope "
        "matches pod. "
        "Pod admit fails because covering quota is missing for BestEffort scope",
        pod("allowed-pod", "", "", "fake-priority"),
        [],
        TWO,
        "insufficient quota to match these scopes: [{BestEffort Exists []}]",
    ),
    (
        "Two scopes,BestEffort and PriorityClassIN, in two LimitedResources. Only PriorityClass scope "
        "matches pod. "
        "Pod admit fails because covering quota is missing for PriorityClass scope",
        pod("allowed-pod", "100m", "1Gi", "cluster-services"),
        [],
        TWO,
        "insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]",
    ),
    (
        "Two scopes,BestEffort and PriorityClassIN, in two LimitedResources. Both the scopes matches pod. "
        "Pod admit fails because covering quota is missing for PriorityClass scope and BestEffort scope",
        pod("allowed-pod", "", "", "cluster-services"),
        [],
        TWO,
        "insufficient quota to match these scopes: [{BestEffort Exists []} {PriorityClass In "
        "[cluster-services]}]",
    ),
    (
        "Two scopes,BestEffort and PriorityClassIN, in two LimitedResources. Both the scopes matches pod. "
        "Quota available only for BestEffort scope. Pod admit fails because covering quota is missing for "
        "PriorityClass scope",
        pod("allowed-pod", "", "", "cluster-services"),
        [BE_QUOTA],
        TWO,
        "insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]",
    ),
    (
        "Two scopes,BestEffort and PriorityClassIN, in two LimitedResources. Both the scopes matches pod. "
        "Quota available only for PriorityClass scope. Pod admit fails because covering quota is missing "
        "for BestEffort scope",
        pod("allowed-pod", "", "", "cluster-services"),
        [quota("quota", selector=PC_IN_CS)],
        TWO,
        "insufficient quota to match these scopes: [{BestEffort Exists []}]",
    ),
    (
        "Two scopes,BestEffort and PriorityClassIN, in two LimitedResources. Both the scopes matches pod. "
        "Quota available only for both the scopes. Pod admit success. No Error",
        pod("allowed-pod", "", "", "cluster-services"),
        [BE_QUOTA, quota("quota", selector=PC_IN_CS)],
        TWO,
        "",
    ),
    (
        "Pod allowed with priorityclass if limited scope PriorityClassNameExists not configured.",
        pod("allowed-pod", "3", "2Gi", "fake-priority"),
        [],
        None,
        "",
    ),
    (
        "quota fails, though covering quota for configured limited scope PriorityClassNameExists exists.",
        pod("not-allowed-pod", "3", "20Gi", "fake-priority"),
        [quota("quota", selector=PC_EXISTS, hard={"memory": "10Gi"})],
        limited(([PC_EXISTS], [])),
        "exceeded quota: quota",
    ),
    (
        "Pod has different priorityclass than configured limited. Covering quota exists for configured "
        "limited scope PriorityClassIn.",
        pod("allowed-pod", "3", "2Gi", "fake-priority"),
        [quota("quota", selector=PC_IN_CS)],
        limited(([PC_IN_CS], [])),
        "",
    ),
    (
        "Pod has limited priorityclass. Covering quota exists for configured limited scope PriorityClassIn.",
        pod("allowed-pod", "3", "2Gi", "cluster-services"),
        [quota("quota", selector=PC_IN_CS)],
        limited(([PC_IN_BOTH], [])),
        "",
    ),
    (
        "Pod has limited priorityclass. Covering quota  does not exist for configured limited scope "
        "PriorityClassIn.",
        pod("not-allowed-pod", "3", "2Gi", "cluster-services"),
        [quota("quota", selector=scope("PriorityClass", "In", ["another-priorityclass-name"]))],
        limited(([PC_IN_BOTH], [])),
        "insufficient quota to match these scopes: [{PriorityClass In [another-priorityclass-name "
        "cluster-services]}]",
    ),
    (
        "From the above test case, just changing pod priority from cluster-services to "
        "another-priorityclass-name. expecting no error",
        pod("allowed-pod", "3", "2Gi", "another-priorityclass-name"),
        [quota("quota", selector=scope("PriorityClass", "In", ["another-priorityclass-name"]))],
        limited(([PC_IN_BOTH], [])),
        "",
    ),
    (
        "Pod has limited priorityclass. Covering quota does NOT exists for configured limited scope "
        "PriorityClassIn.",
        pod("not-allowed-pod", "3", "2Gi", "cluster-services"),
        [],
        limited(([PC_IN_BOTH], [])),
        "insufficient quota to match these scopes: [{PriorityClass In [another-priorityclass-name "
        "cluster-services]}]",
    ),
    (
        "Pod has limited priorityclass. Covering quota exists for configured limited scope "
        "PriorityClassIn through PriorityClassNameExists",
        pod("allowed-pod", "3", "2Gi", "cluster-services"),
        [quota("quota", selector=PC_EXISTS)],
        limited(([PC_IN_BOTH], [])),
        "",
    ),
]


@pytest.mark.parametrize(
    ("manifest", "quotas", "config", "error"),
    [pytest.param(*row[1:], id=f"TestAdmitLimitedScopeWithCoverQuota-{row[0]}") for row in CASES],
)
def test_admit_limited_scope_with_cover_quota(
    ledger: QuotaEngine,
    manifest: dict[str, Any],
    quotas: list[dict[str, Any]],
    config: dict[str, Any] | None,
    error: str,
) -> None:
    if config is not None:
        ledger.apply_admission_config(config)
    for each in quotas:
        ledger.apply_resource_quota(each)
    if not error:
        assert ledger.reserve_pod(manifest).queue == "root.test"
        return
    kind = OverQuota if error.startswith("exceeded quota") else MissingCoveringQuota
    with pytest.raises(kind) as refused:
        ledger.reserve_pod(manifest)
    if kind is OverQuota:
        assert [(v.scope, v.resource) for v in refused.value.violations] == [("test/quota", "memory")]
    else:
        assert error in str(refused.value)
