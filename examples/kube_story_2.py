"""User story 2: a quota that selects by Exists limits pods of any priority class; pods without
one are not counted. Also the two accounting patterns: Kubernetes counts a pod when it is
submitted (reserve at admission, commit when bound), YuniKorn when it is scheduled (reserve and
commit at once, when the scheduler places it)."""

import sys
import tempfile

from quota_ledger import OverQuota, QuotaEngine

QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "prioritized", "namespace": "analytics"},
    "spec": {
        "hard": {"pods": "2", "requests.cpu": "2", "requests.memory": "4Gi"},
        "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "Exists"}]},
    },
}


def pod(name: str, priority: str | None) -> dict:
    spec: dict = {
        "containers": [{"name": "job", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]
    }
    if priority:
        spec["priorityClassName"] = priority
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "analytics", "uid": name},
        "spec": spec,
    }


url = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{tempfile.mkdtemp()}/story2.db"
with QuotaEngine.from_url(url) as engine:
    engine.migrate()
    engine.apply_resource_quota(QUOTA)

    # Kubernetes' pattern: admission reserves at submission, binding commits, deletion releases.
    submitted = engine.reserve_pod(pod("etl-high", "high"), ttl=600)
    engine.commit(submitted.id)  # the pod was bound to a node

    # YuniKorn's pattern: nothing is counted while the pod waits; the scheduler reserves and
    # commits in one go when it places the pod (a short ttl covers a scheduler crash in between).
    placed = engine.reserve_pod(pod("etl-low", "low"), ttl=30)
    engine.commit(placed.id)

    try:
        engine.reserve_pod(pod("etl-medium", "medium"))
    except OverQuota as refused:
        print("refused:", refused.violations[0].describe())  # pods at analytics/prioritized
    engine.reserve_pod(pod("adhoc", None))  # no priority class: outside the quota's scope
    print("status:", engine.resource_quota_status("analytics", "prioritized"))
    engine.release_pod(pod("etl-high", "high"))  # the pod was deleted
    print("after release:", engine.resource_quota_status("analytics", "prioritized")["used"])
