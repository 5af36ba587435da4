"""Group commit: reserve+commit pairs/s of ``batching=True`` vs one transaction per call, all
threads on one hot queue, side by side on each backend; and the latency of a paced, quiet
caller (target: p99 under 20 ms with batching).

:func:`library_pairs` is the one in-process measurement of both modes: the hot case runs it for
its ``library`` and ``batching`` columns on PostgreSQL. When that case ran, PostgreSQL's rounds
here are its columns (the same threads and rounds, side by side with the service and pgbench
there) and only the quiet caller is measured again; MariaDB and SQLite are measured here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL

from benchmarks.database import fresh_database, fresh_mariadb_database, fresh_sqlite_database
from benchmarks.harness import log, median, run_threads, side_by_side
from benchmarks.settings import Config
from benchmarks.workload import HOT_LIMITS, HOT_QUEUE, REQUEST, TTL_SECONDS, LibraryWorker, queue_picker
from quota_ledger import QuotaEngine

#: the two modes, and the hot case's column of each
MODES = {"per-call": "library", "batching": "batching"}
#: calls per second of the quiet caller, and how many it makes
PACED_RATE = 100.0
PACED_CALLS = 400
TARGET_P99_MS = 20.0


@dataclass
class Batches:
    """Transactions and requests the batching engines of a case decided, summed over them."""

    batches: int = 0
    requests: int = 0

    def add(self, engine: QuotaEngine) -> None:
        stats = engine.batch_stats  # zeros without batching
        self.batches += stats.batches
        self.requests += stats.requests

    @property
    def mean(self) -> float:
        """Requests per batch."""
        return self.requests / self.batches if self.batches else 0.0


def library_pairs(
    db_url: URL, threads: int, seed: int, cfg: Config, *, batching: bool, batches: Batches
) -> float:
    """Library threads in process on ``root.hot``, on an engine of their own (closed after, so
    that its connections do not count against the next measurement's); pairs/s. Its batches
    are added to ``batches``."""
    engine = QuotaEngine.from_url(db_url, pool_size=threads + 2, batching=batching)
    try:
        pick = queue_picker("hot", 1)
        workers = [LibraryWorker(engine, pick, seed + i) for i in range(threads)]
        rate = run_threads(workers, cfg.warmup, cfg.seconds).pairs_per_s
        batches.add(engine)
        return rate
    finally:
        engine.close()


def paced(db_url: URL, batching: bool, rate: float, calls: int) -> dict[str, float]:
    """One caller, reserve then commit, ``rate`` calls per second: per-call latency in ms. One
    pair first, untimed, so that the engine has connected and compiled its configuration."""
    engine = QuotaEngine.from_url(db_url, batching=batching)
    try:
        engine.commit(engine.reserve(HOT_QUEUE, REQUEST, ttl=TTL_SECONDS).id)
        latencies: list[float] = []
        due = time.perf_counter()
        made = None
        for i in range(calls):
            due += 1.0 / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            started = time.perf_counter()
            if i % 2 == 0:
                made = engine.reserve(HOT_QUEUE, REQUEST, ttl=TTL_SECONDS)
            else:
                assert made is not None
                engine.commit(made.id)
            latencies.append((time.perf_counter() - started) * 1000)
    finally:
        engine.close()
    latencies.sort()
    return {
        "p50_ms": latencies[len(latencies) // 2],
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def measure(cfg: Config, db_url: URL, backend: str, *, rounds: bool) -> dict[str, Any]:
    """Per-call vs batching on ``db_url``: with ``rounds``, pairs/s at each thread count; then
    the paced caller in each mode, and the audit."""
    setup = QuotaEngine.from_url(db_url)
    try:
        setup.migrate()
        setup.set_limits(HOT_QUEUE, HOT_LIMITS)
        setup.commit(setup.reserve(HOT_QUEUE, REQUEST).id)  # the counters exist
    finally:
        setup.close()
    result: dict[str, Any] = {"backend": backend, "threads": {}, "paced": {}}
    if rounds:
        batches = Batches()
        for count in cfg.hot_clients:

            def rate(mode: str, round_: int, count: int = count) -> float:
                batching = mode == "batching"
                return library_pairs(db_url, count, 97 * round_, cfg, batching=batching, batches=batches)

            pairs = list(
                side_by_side(
                    cfg.repeat, lambda: None, lambda r: rate("per-call", r), lambda r: rate("batching", r)
                )
            )
            per_call, batching = [a for a, _ in pairs], [b for _, b in pairs]
            result["threads"][count] = {"per-call": per_call, "batching": batching}
            log(
                f"group commit {backend:10} threads={count:2} per-call {median(per_call):7.0f}"
                f" batching {median(batching):7.0f} pairs/s"
            )
        result["requests_per_batch"] = batches.mean
    for mode in MODES:
        result["paced"][mode] = paced(db_url, mode == "batching", PACED_RATE, PACED_CALLS)
        log(f"group commit {backend:10} paced {mode}: {result['paced'][mode]}")
    engine = QuotaEngine.from_url(db_url)
    try:
        result["audit"] = [str(d) for d in engine.audit()]
    finally:
        engine.close()
    return result


def from_hot(hot: dict[str, Any]) -> dict[str, Any]:
    """PostgreSQL's rounds as the hot case measured them: its in-process columns."""
    return {
        "threads": {
            clients: {mode: hot["samples"][str(clients)][column] for mode, column in MODES.items()}
            for clients in hot["clients"]
        },
        "requests_per_batch": hot["requests_per_batch"],
        "rounds_from": "hot",
    }


def run(cfg: Config, hot: dict[str, Any] | None) -> list[dict[str, Any]]:
    """PostgreSQL (the run's server; its rounds from ``hot``, the hot case's result, when it
    ran), MariaDB (``--mariadb``), SQLite."""
    with fresh_database(cfg.server_url) as db_url:
        postgresql = measure(cfg, db_url, "postgresql", rounds=hot is None)
    if hot is not None:
        postgresql.update(from_hot(hot))
    results = [postgresql]
    with fresh_mariadb_database(cfg.mariadb_url) as db_url:
        results.append(measure(cfg, db_url, "mariadb", rounds=True))
    with fresh_sqlite_database() as db_url:
        results.append(measure(cfg, db_url, "sqlite", rounds=True))
    return results
