"""Kubernetes' ResourceQuota validation, TestValidateResourceQuota in
pkg/apis/core/validation/validation_test.go (kubernetes/kubernetes).

Each case is a ResourceQuota that the API server accepts or refuses; the ledger must do the
same, and for a refusal name the same field. Details are the ledger's and are not compared.
"""

from __future__ import annotations

from typing import Any

import pytest

from quota_ledger.kube import quotas
from quota_ledger.model.errors import InvalidResourceQuota

SPEC = {
    "hard": {
        "cpu": "100", "memory": "10000", "requests.cpu": "100", "requests.memory": "10000",
        "limits.cpu": "100", "limits.memory": "10000", "pods": "10", "services": "0",
        "replicationcontrollers": "10", "resourcequotas": "10", "configmaps": "10", "secrets": "10",
        # unknown and not enforced unless DRA is enabled, but not invalid
        "count/resourceclaims.resource.k8s.io": "1", "gold.deviceclass.resource.k8s.io/devices": "1",
    }
}  # fmt: skip
TERMINATING = {"hard": {"cpu": "100", "limits.cpu": "200"}, "scopes": ["Terminating"]}
NON_TERMINATING = {"hard": {"cpu": "100"}, "scopes": ["NotTerminating"]}
BEST_EFFORT = {"hard": {"pods": "100"}, "scopes": ["BestEffort"]}
NON_BEST_EFFORT = {"hard": {"cpu": "100"}, "scopes": ["NotBestEffort"]}
CROSS_NAMESPACE = {"hard": {"cpu": "100", "limits.cpu": "200"}, "scopes": ["CrossNamespacePodAffinity"]}
SCOPE_SELECTOR = {
    "scopeSelector": {
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["cluster-services"]}]
    }
}
INVALID_QUOTA_RESOURCE = {"hard": {"storage": "10"}}  # storage is not a quota-tracked resource
NEGATIVE = {
    "hard": {
        "cpu": "-100", "memory": "-10000", "pods": "-10", "services": "-10", "replicationcontrollers": "-10",
        "resourcequotas": "-10", "configmaps": "-10", "secrets": "-10",
    }
}  # fmt: skip
FRACTIONAL_COMPUTE = {"hard": {"cpu": "100m"}}
FRACTIONAL_POD = {
    "hard": {"pods": ".1", "services": ".5", "replicationcontrollers": "1.25", "resourcequotas": "2.5"}
}
TERMINATING_PAIR = {"hard": {"cpu": "100"}, "scopes": ["Terminating", "NotTerminating"]}
BEST_EFFORT_PAIR = {"hard": {"pods": "100"}, "scopes": ["BestEffort", "NotBestEffort"]}
INVALID_CROSS_NAMESPACE = {
    "scopeSelector": {
        "matchExpressions": [
            {"scopeName": "CrossNamespacePodAffinity", "operator": "In", "values": ["cluster-services"]}
        ]
    }
}
INVALID_SCOPE_NAME = {"hard": {"cpu": "100"}, "scopes": ["foo"]}

# name -> (metadata.name, metadata.namespace, spec, the field upstream's error is about or None)
CASES: dict[str, tuple[str, str, dict[str, Any], str | None]] = {
    "no-scope": ("abc", "foo", SPEC, None),
    "fractional-compute-spec": ("abc", "foo", FRACTIONAL_COMPUTE, None),
    "terminating-spec": ("abc", "foo", TERMINATING, None),
    "non-terminating-spec": ("abc", "foo", NON_TERMINATING, None),
    "best-effort-spec": ("abc", "foo", BEST_EFFORT, None),
    "cross-namespace-affinity-spec": ("abc", "foo", CROSS_NAMESPACE, None),
    "scope-selector-spec": ("abc", "foo", SCOPE_SELECTOR, None),
    "non-best-effort-spec": ("abc", "foo", NON_BEST_EFFORT, None),
    "zero-length Name": ("", "foo", SPEC, "metadata.name"),
    "zero-length Namespace": ("abc", "", SPEC, "metadata.namespace"),
    "invalid Name": ("^Invalid", "foo", SPEC, "metadata.name"),
    "invalid Namespace": ("abc", "^Invalid", SPEC, "metadata.namespace"),
    "negative-limits": ("abc", "foo", NEGATIVE, "spec.hard"),
    "fractional-api-resource": ("abc", "foo", FRACTIONAL_POD, "spec.hard"),
    "invalid-quota-resource": ("abc", "foo", INVALID_QUOTA_RESOURCE, "spec.hard[storage]"),
    "invalid-quota-terminating-pair": ("abc", "foo", TERMINATING_PAIR, "spec.scopes"),
    "invalid-quota-besteffort-pair": ("abc", "foo", BEST_EFFORT_PAIR, "spec.scopes"),
    "invalid-quota-scope-name": ("abc", "foo", INVALID_SCOPE_NAME, "spec.scopes"),
    "invalid-cross-namespace-affinity": ("abc", "foo", INVALID_CROSS_NAMESPACE, "spec.scopeSelector"),
}


@pytest.mark.parametrize(
    ("name", "namespace", "spec", "field"),
    [pytest.param(*row, id=f"TestValidateResourceQuota-{key}") for key, row in CASES.items()],
)
def test_validate_resource_quota(name: str, namespace: str, spec: dict[str, Any], field: str | None) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    if field is None:
        assert quotas.parse(manifest).key == f"{namespace}/{name}"
        return
    with pytest.raises(InvalidResourceQuota) as caught:
        quotas.parse(manifest)
    fields = [where for where, _ in caught.value.errors]
    assert fields, caught.value
    assert all(where.startswith(field) for where in fields), fields
