"""Group commit: reserve+commit pairs/s of ``batching=True`` vs one transaction per call, all
threads on one hot queue, side by side on each backend; and the latency of a paced, quiet
caller (target: p99 under 20 ms with batching)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.engine import URL

from benchmarks.database import fresh_database, fresh_mariadb_database, fresh_sqlite_database
from benchmarks.harness import log, median, run_threads, side_by_side
from benchmarks.settings import Config
from benchmarks.workload import HOT_LIMITS, HOT_QUEUE, REQUEST, TTL_SECONDS, LibraryWorker
from quota_ledger import QuotaEngine

#: threads of the side-by-side rounds
THREADS = (16, 64)
#: calls per second of the quiet caller, and how many it makes
PACED_RATE = 100.0
PACED_CALLS = 400
TARGET_P99_MS = 20.0


def paced(engine: QuotaEngine, rate: float, calls: int) -> dict[str, float]:
    """One caller, reserve then commit, ``rate`` calls per second: per-call latency in ms."""
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
    latencies.sort()
    return {
        "p50_ms": latencies[len(latencies) // 2],
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def measure(cfg: Config, db_url: URL, backend: str) -> dict[str, Any]:
    """Per-call vs batching on ``db_url``: pairs/s at each thread count, then the paced caller."""
    setup = QuotaEngine.from_url(db_url)
    try:
        setup.migrate()
        setup.set_limits(HOT_QUEUE, HOT_LIMITS)
        setup.commit(setup.reserve(HOT_QUEUE, REQUEST).id)  # the counters exist
    finally:
        setup.close()
    threads = [4] if cfg.quick else list(THREADS)
    engines = {
        mode: QuotaEngine.from_url(db_url, pool_size=max(threads) + 2, batching=mode == "batching")
        for mode in ("per-call", "batching")
    }
    result: dict[str, Any] = {"backend": backend, "threads": {}, "paced": {}}
    try:
        for count in threads:

            def rate(mode: str, round_: int, count: int = count) -> float:
                workers = [
                    LibraryWorker(engines[mode], lambda _r: HOT_QUEUE, 97 * round_ + i) for i in range(count)
                ]
                try:
                    return run_threads(workers, cfg.warmup, cfg.seconds).pairs_per_s
                finally:
                    engines[mode].driver.engine.dispose()  # 64 connections are not kept open

            rounds = list(
                side_by_side(
                    cfg.repeat, lambda: None, lambda r: rate("per-call", r), lambda r: rate("batching", r)
                )
            )
            per_call, batching = [a for a, _ in rounds], [b for _, b in rounds]
            result["threads"][count] = {"per-call": per_call, "batching": batching}
            log(
                f"group commit {backend:10} threads={count:2} per-call {median(per_call):7.0f}"
                f" batching {median(batching):7.0f} pairs/s"
            )
        stats = engines["batching"].batch_stats
        result["requests_per_batch"] = stats.requests / stats.batches if stats.batches else 0.0
        for mode, engine in engines.items():
            result["paced"][mode] = paced(engine, PACED_RATE, PACED_CALLS)
            log(f"group commit {backend:10} paced {mode}: {result['paced'][mode]}")
        audit = engines["per-call"].audit()
        result["audit"] = [str(d) for d in audit]
    finally:
        for engine in engines.values():
            engine.close()
    return result


def run(cfg: Config) -> list[dict[str, Any]]:
    """PostgreSQL (the run's server), MariaDB (``--mariadb``), SQLite."""
    results = []
    with fresh_database(cfg.server_url) as db_url:
        results.append(measure(cfg, db_url, "postgresql"))
    with fresh_mariadb_database(cfg.mariadb_url) as db_url:
        results.append(measure(cfg, db_url, "mariadb"))
    with fresh_sqlite_database() as db_url:
        results.append(measure(cfg, db_url, "sqlite"))
    return results
