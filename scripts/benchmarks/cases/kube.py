"""Pods under ResourceQuotas: ``reserve_pod`` + commit in namespaces with 5 scoped quotas each,
side by side with namespaces without any (target: cost <= 1.5x)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

from benchmarks.database import conninfo, fresh_database, vacuum
from benchmarks.harness import log, median_ratio, run_threads, side_by_side
from benchmarks.settings import Config
from benchmarks.workload import TTL_SECONDS
from quota_ledger import QuotaEngine

TARGET_KUBE_COST = 1.5
KUBE_NAMESPACES = 40


def kube_pod(namespace: str, rng: random.Random) -> dict[str, Any]:
    """A pod of priority class ``high`` requesting 1m CPU and 1Mi of memory."""
    name = f"p-{uuid.uuid4().hex[:12]}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
        "spec": {
            "priorityClassName": "high",
            "containers": [
                {
                    "name": "app",
                    "resources": {
                        "requests": {"cpu": "1m", "memory": "1Mi"},
                        "limits": {"cpu": "1m", "memory": "1Mi"},
                    },
                }
            ],
        },
    }


def kube_quotas(namespace: str) -> list[dict[str, Any]]:
    """5 scoped quotas that all match a ``high`` priority pod, each tracking 2-3 resources."""
    big = {"pods": "1000000", "requests.cpu": "1000000", "requests.memory": "1Pi"}

    def priority(operator: str, *values: str) -> dict[str, Any]:
        expression: dict[str, Any] = {"scopeName": "PriorityClass", "operator": operator}
        if values:
            expression["values"] = list(values)
        return {"scopeSelector": {"matchExpressions": [expression]}}

    selectors: list[dict[str, Any]] = [
        priority("In", "high"),
        priority("NotIn", "low"),
        priority("Exists"),
        {"scopes": ["NotTerminating"]},
        {"scopes": ["NotBestEffort"]},
    ]
    return [
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": f"q{i}", "namespace": namespace},
            "spec": {"hard": big, **selector},
        }
        for i, selector in enumerate(selectors)
    ]


class PodWorker:
    """reserve_pod then commit, in one of the given namespaces."""

    def __init__(self, engine: QuotaEngine, namespaces: Sequence[str], seed: int) -> None:
        self.engine = engine
        self.namespaces = list(namespaces)
        self.rng = random.Random(seed)

    def pair(self) -> None:
        made = self.engine.reserve_pod(kube_pod(self.rng.choice(self.namespaces), self.rng), ttl=TTL_SECONDS)
        self.engine.commit(made.id)

    def close(self) -> None:
        pass


def run(cfg: Config) -> dict[str, Any]:
    """Pods in namespaces with 5 scoped ResourceQuotas vs without, side by side, alternating."""
    threads = cfg.side_threads
    plain = [f"plain{i:03d}" for i in range(KUBE_NAMESPACES)]
    quoted = [f"quota{i:03d}" for i in range(KUBE_NAMESPACES)]
    result: dict[str, Any] = {"threads": threads, "namespaces": KUBE_NAMESPACES, "none": [], "five": []}
    with fresh_database(cfg.server_url) as db_url:
        engine = QuotaEngine.from_url(db_url, pool_size=threads + 2)
        try:
            engine.migrate()
            started = time.perf_counter()
            for namespace in quoted:
                for manifest in kube_quotas(namespace):
                    engine.apply_resource_quota(manifest)
            result["setup_s"] = time.perf_counter() - started
            warm = random.Random(5)
            for namespace in [*plain, *quoted]:  # first reservations create the queue counters
                engine.commit(engine.reserve_pod(kube_pod(namespace, warm)).id)
            rounds = side_by_side(
                cfg.repeat,
                lambda: vacuum(conninfo(db_url)),
                lambda round_: (
                    run_threads(
                        [PodWorker(engine, plain, 11 * round_ + i) for i in range(threads)],
                        cfg.warmup,
                        cfg.seconds,
                    ).pairs_per_s
                ),
                lambda round_: (
                    run_threads(
                        [PodWorker(engine, quoted, 13 * round_ + i) for i in range(threads)],
                        cfg.warmup,
                        cfg.seconds,
                    ).pairs_per_s
                ),
            )
            for none, five in rounds:
                result["none"].append(none)
                result["five"].append(five)
                log(f"threads={threads} pods without quotas {none:.1f}, with 5 quotas {five:.1f} pairs/s")
            result["audit"] = [str(d) for d in engine.audit()]
            status = engine.resource_quota_status(quoted[0], "q0")
            result["sample_status"] = status
        finally:
            engine.close()
    result["cost_ratio"] = median_ratio(result["none"], result["five"])
    return result
