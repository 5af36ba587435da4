"""User story 1: pods of priority class cluster-services may only run in kube-system, and only
while a quota there covers that priority class (Kubernetes' "limit priority class consumption")."""

import sys
import tempfile

from quota_ledger import MissingCoveringQuota, QuotaEngine

ADMISSION = """
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

QUOTA = """
apiVersion: v1
kind: ResourceQuota
metadata: {name: pods-cluster-services, namespace: kube-system}
spec:
  hard: {pods: "10", requests.cpu: "4"}
  scopeSelector:
    matchExpressions:
    - {scopeName: PriorityClass, operator: In, values: ["cluster-services"]}
"""


def pod(namespace: str, name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}"},
        "spec": {
            "priorityClassName": "cluster-services",
            "containers": [{"name": "dns", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}}],
        },
    }


url = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{tempfile.mkdtemp()}/story1.db"
with QuotaEngine.from_url(url) as engine:
    engine.migrate()
    engine.apply_admission_config(ADMISSION)
    try:
        engine.reserve_pod(pod("kube-system", "coredns-1"))
    except MissingCoveringQuota as refused:
        print(
            "refused:", refused
        )  # insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]
    engine.apply_resource_quota(QUOTA)
    admitted = engine.reserve_pod(pod("kube-system", "coredns-1"))
    engine.commit(admitted.id)
    print("admitted:", admitted.queue, admitted.resources)
    print("status:", engine.resource_quota_status("kube-system", "pods-cluster-services"))
    try:
        engine.reserve_pod(pod("default", "sneaky"))  # no covering quota in this namespace
    except MissingCoveringQuota as refused:
        print("refused:", refused)
