"""Hierarchical limits: reserve+commit as 1,000 users in a depth-4 tree with user and group
limits at two levels, side by side with the flat spread-out queues (target: >= 0.5x flat)."""

from __future__ import annotations

import random
import time
from typing import Any

from benchmarks.database import conninfo, fresh_database, vacuum
from benchmarks.harness import log, median_ratio, run_threads, side_by_side
from benchmarks.settings import Config
from benchmarks.workload import (
    PARTITION,
    RESOURCES,
    ROOT,
    SPREAD_LIMITS,
    TTL_SECONDS,
    LibraryWorker,
    queue_picker,
    spread_queue,
)
from quota_ledger import QuotaEngine

TARGET_HIERARCHY = 0.5
HIER_USERS = 1000
HIER_GROUPS = 20
HIER_REQUEST: dict[str, Any] = {"vcore": "1m", "memory": "1Mi"}


def hier_queue(user: int) -> str:
    """root.org.d<N>.t<M>: depth 4; each user always works in the same leaf."""
    return f"root.org.d{user % 10}.t{(user // 10) % 10}"


def hierarchy_config(flat_scopes: int) -> dict[str, Any]:
    """User and group limits at two levels (root.org and each department), 2 resources, and a
    max on each of the 100 leaves (as each flat queue has one).

    Limits are far above what a run uses: the benchmark measures the cost of enforcing them.
    Also holds ``flat_scopes`` queues like the spread case, for the side-by-side flat baseline.
    """
    big = {"vcore": "1000000", "memory": "1Pi"}
    group_limits = [
        {"groups": [f"g{g:02d}" for g in range(HIER_GROUPS)], "maxresources": big},
        {"groups": ["*"], "maxresources": big},
    ]
    user_limits = [{"users": ["*"], "maxresources": big, "maxapplications": 10}]
    departments = [
        {
            "name": f"d{d}",
            "limits": [*user_limits, *group_limits],
            "queues": [{"name": f"t{t}", "resources": {"max": big}} for t in range(10)],
        }
        for d in range(10)
    ]
    org = {
        "name": "org",
        "limits": [*user_limits, *group_limits],
        "queues": departments,
    }
    flat = [
        {"name": spread_queue(i).split(".")[1], "resources": {"max": SPREAD_LIMITS}}
        for i in range(flat_scopes)
    ]
    return {"partitions": [{"name": PARTITION, "queues": [{"name": ROOT, "queues": [org, *flat]}]}]}


class HierarchyWorker:
    """reserve then commit as one of 1,000 users, in a depth-4 tree with user and group limits."""

    def __init__(self, engine: QuotaEngine, seed: int) -> None:
        self.engine = engine
        self.rng = random.Random(seed)

    def pair(self) -> None:
        user = self.rng.randrange(HIER_USERS)
        reservation = self.engine.reserve(
            hier_queue(user),
            HIER_REQUEST,
            user=f"u{user:04d}",
            groups=[f"g{user % HIER_GROUPS:02d}", "staff"],
            application=f"app-{user:04d}",
            ttl=TTL_SECONDS,
        )
        self.engine.commit(reservation.id)

    def close(self) -> None:
        pass


def run(cfg: Config) -> dict[str, Any]:
    """Hierarchical vs flat reserve+commit, side by side on one fresh database, alternating."""
    threads = cfg.side_threads
    result: dict[str, Any] = {"threads": threads, "users": HIER_USERS, "flat": [], "hierarchy": []}
    with fresh_database(cfg.server_url) as db_url:
        engine = QuotaEngine.from_url(db_url, pool_size=threads + 2)
        try:
            engine.migrate()
            engine.apply_config(hierarchy_config(cfg.scopes))
            # First reservations create queue counters and each user's wildcard counters:
            # pay that once here, not in the measured window.
            started = time.perf_counter()
            warm = HierarchyWorker(engine, 1)
            for user in range(HIER_USERS):
                warm.rng = random.Random(user)
                r = engine.reserve(
                    hier_queue(user),
                    HIER_REQUEST,
                    user=f"u{user:04d}",
                    groups=[f"g{user % HIER_GROUPS:02d}", "staff"],
                    application=f"app-{user:04d}",
                )
                engine.commit(r.id)
            pairs = [(spread_queue(i), res) for i in range(cfg.scopes) for res in RESOURCES]
            engine.driver.run(lambda tx: tx.create_missing(PARTITION, pairs, tx.db_now()))
            result["prewarm_s"] = time.perf_counter() - started
            pick = queue_picker("spread", cfg.scopes)
            rounds = side_by_side(
                cfg.repeat,
                lambda: vacuum(conninfo(db_url)),
                lambda round_: (
                    run_threads(
                        [LibraryWorker(engine, pick, 17 * round_ + i) for i in range(threads)],
                        cfg.warmup,
                        cfg.seconds,
                    ).pairs_per_s
                ),
                lambda round_: (
                    run_threads(
                        [HierarchyWorker(engine, 29 * round_ + i) for i in range(threads)],
                        cfg.warmup,
                        cfg.seconds,
                    ).pairs_per_s
                ),
            )
            for flat, hier in rounds:
                result["flat"].append(flat)
                result["hierarchy"].append(hier)
                log(f"threads={threads} flat {flat:.1f} hierarchy {hier:.1f} pairs/s")
            drifts = engine.audit()
            result["audit"] = [str(d) for d in drifts]
            result["identity_counters"] = len(
                engine.driver.run(lambda tx: tx.identity_counters(PARTITION, lock=False))
            )
        finally:
            engine.close()
    result["ratio"] = median_ratio(result["hierarchy"], result["flat"])
    return result
