"""The ledger every case measures: the request, the queues and their limits, how a worker
picks a queue, the library's reserve+commit pair, and the setup that pre-creates counters."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import URL

from benchmarks.harness import log
from quota_ledger import QuotaEngine
from quota_ledger.driver.dialect import advisory_key

PARTITION = "default"
ROOT = "root"
HOT_QUEUE = "root.hot"
PATTERNS = ("spread", "hot")
REQUEST: dict[str, Any] = {"fpga": 1, "memory": "1Gi"}
AMOUNTS: dict[str, int] = {"fpga": 1, "memory": 2**30}  # REQUEST in base units, sorted by name
RESOURCES = tuple(sorted(AMOUNTS))
TTL_SECONDS = 300.0
TTL = timedelta(seconds=TTL_SECONDS)
SPREAD_LIMITS: dict[str, Any] = {"fpga": 10**12, "memory": "1Ti"}  # 1024 pairs per queue
HOT_LIMITS: dict[str, Any] = {"fpga": 10**15, "memory": "1Ei"}  # 2^30 pairs: never refuses
PG_LOCK_KEY = advisory_key(PARTITION)


# What the library records for REQUEST: its Kubernetes quota usage and scope attributes.
KUBE_JSON = json.dumps(
    {
        "scopes": {
            "bestEffort": False,
            "crossNamespacePodAffinity": False,
            "priorityClass": None,
            "terminating": False,
        },
        "usage": {
            "count/pods": 1,
            "limits.memory": AMOUNTS["memory"],
            "memory": AMOUNTS["memory"],
            "pods": 1,
            "requests.fpga": AMOUNTS["fpga"],
            "requests.memory": AMOUNTS["memory"],
        },
    },
    sort_keys=True,
    separators=(",", ":"),
)


def spread_queue(index: int) -> str:
    """``root.p<index>``: one of the spread-out queues."""
    return f"root.p{index:05d}"


QueuePicker = Callable[[random.Random], str]


def queue_picker(pattern: str, scopes: int) -> QueuePicker:
    """``hot``: always ``root.hot``; ``spread``: a random one of ``scopes`` queues."""
    if pattern == "hot":
        return lambda _rng: HOT_QUEUE
    return lambda rng: spread_queue(rng.randrange(scopes))


class LibraryWorker:
    """reserve then commit through the public API."""

    def __init__(self, engine: QuotaEngine, pick: QueuePicker, seed: int) -> None:
        self.engine = engine
        self.pick = pick
        self.rng = random.Random(seed)

    def pair(self) -> None:
        reservation = self.engine.reserve(self.pick(self.rng), REQUEST, ttl=TTL_SECONDS)
        self.engine.commit(reservation.id)

    def close(self) -> None:
        pass


def setup_ledger(db_url: URL, scopes: int) -> dict[str, float]:
    """Migrate, set the limits, and create every queue counter the runs will touch.

    Through the library, on an engine of its own whose sessions do not wait for the WAL flush
    at commit (``synchronous_commit=off``): the 10,000 ``set_limits`` calls are 10,000
    transactions, and their durability does not matter to a benchmark database.
    """
    engine = QuotaEngine.from_url(
        db_url.update_query_dict({"options": "-c synchronous_commit=off"}), pool_size=2
    )
    try:
        return setup_engine(engine, scopes)
    finally:
        engine.close()


def setup_engine(engine: QuotaEngine, scopes: int) -> dict[str, float]:
    """:func:`setup_ledger` on an engine the caller holds; returns each step's seconds."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    engine.migrate()
    timings["migrate_s"] = time.perf_counter() - started

    started = time.perf_counter()
    # One configuration for all queues: each set_limits call is a whole config version.
    children = [{"name": HOT_QUEUE.split(".")[1], "resources": {"max": HOT_LIMITS}}]
    children += [
        {"name": spread_queue(index).split(".")[1], "resources": {"max": SPREAD_LIMITS}}
        for index in range(scopes)
    ]
    engine.apply_config({"partitions": [{"name": PARTITION, "queues": [{"name": ROOT, "queues": children}]}]})
    timings["set_limits_s"] = time.perf_counter() - started
    log(f"applied limits on {scopes + 1} queues in {timings['set_limits_s']:.1f} s")

    # The first reservation in a queue creates its zeroed queue counters in a transaction of
    # its own (LedgerTx.create_missing) and starts again. Run that very code once for every
    # queue, so no timed pair pays for it and all implementations find the same rows.
    started = time.perf_counter()
    queues = [HOT_QUEUE, *(spread_queue(i) for i in range(scopes))]
    pairs = [(queue, resource) for queue in queues for resource in RESOURCES]
    engine.driver.run(lambda tx: tx.create_missing(PARTITION, pairs, tx.db_now()))
    timings["prewarm_counters_s"] = time.perf_counter() - started
    log(f"pre-warmed {len(pairs)} queue counters in {timings['prewarm_counters_s']:.1f} s")
    return timings
