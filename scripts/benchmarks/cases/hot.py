"""One hot queue: every client reserves and commits on ``root.hot``, at 16 and 64 clients, side
by side in each round:

* ``library``: ``QuotaEngine`` in process, one transaction per call;
* ``batching``: ``QuotaEngine(batching=True)`` in process (group commit); these two columns are
  ``group_commit.library_pairs``, and the group-commit case quotes them as its PostgreSQL rows;
* ``service``: the HTTP service with batching, one operation per request;
* ``batch``: the same service, each client sending its reserves as one ``POST /v1/batch``,
  then their commits as another;
* ``pgbench``: the pgbench hot script, one transaction per call: the one-transaction-per-call
  ceiling of any client.

Then the latency of a paced 100 requests/s load on the service with batching. Targets: the
service (its better mode) >= 3x pgbench, the service one operation per request >= 1x the
library at 16 clients, paced p99 < 20 ms.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.engine import URL

from benchmarks import pgbench
from benchmarks.cases.group_commit import Batches, library_pairs
from benchmarks.cases.http import RawHttp, http_pairs, paced_latencies, percentile, service_process
from benchmarks.database import config_version, conninfo, fresh_database, server_version, vacuum
from benchmarks.harness import BenchError, log, median
from benchmarks.settings import Config
from benchmarks.workload import REQUEST, TTL_SECONDS, queue_picker, setup_engine
from quota_ledger import QuotaEngine

COLUMNS = ("library", "batching", "service", "batch", "pgbench")
TARGET_VS_PGBENCH = 3.0
TARGET_VS_LIBRARY = 1.0
TARGET_P99_MS = 20.0
#: connections of each service worker's pool: the service, the library's threads and pgbench's
#: clients must fit under the server's max_connections (100 by default)
SERVICE_POOL = 4
#: seconds a batch column measures at most, waiting for two round trips per client
MAX_WINDOW = 60.0


def batch_pairs(base: str, token: str, clients: int, size: int, warmup: float, seconds: float) -> float:
    """Closed loop: ``clients`` keep-alive connections, each sending ``size`` reserves as one
    ``POST /v1/batch``, then their ``size`` commits as another; pairs/s."""
    where = urlsplit(base)
    reserve = json.dumps(
        {"op": "reserve", "queue": "root.hot", "resources": REQUEST, "ttl": TTL_SECONDS},
        separators=(",", ":"),
    )
    reserves = f'{{"operations":[{",".join([reserve] * size)}]}}'.encode()

    async def main() -> float:
        count = 0
        counting = False
        stop = False

        async def loop() -> None:
            nonlocal count
            conn = RawHttp(where.hostname or "127.0.0.1", where.port or 80, token)
            try:
                while not stop:
                    ids = [
                        result["body"]["id"]
                        for result in _results(await conn.post("/v1/batch", reserves), 201)
                    ]
                    commits = ",".join(f'{{"op":"commit","id":"{rid}"}}' for rid in ids)
                    _results(await conn.post("/v1/batch", f'{{"operations":[{commits}]}}'.encode()), 200)
                    if counting:
                        count += size
            finally:
                conn.close()

        tasks = [asyncio.create_task(loop()) for _ in range(clients)]
        await asyncio.sleep(warmup)
        counting = True
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        # A round trip of a whole batch may take longer than the window: count at least two
        # per client, so that the rate does not hang on where the window cuts them.
        while count < 2 * clients * size and time.perf_counter() - started < MAX_WINDOW:
            await asyncio.sleep(0.05)
        counting = False
        elapsed = time.perf_counter() - started
        stop = True
        await asyncio.gather(*tasks)
        return count / elapsed

    return asyncio.run(main())


def _results(answer: tuple[int, bytes], expected: int) -> list[dict[str, Any]]:
    status, payload = answer
    if status != 200:
        raise BenchError(f"http batch: {status} {payload[:200]!r}")
    results: list[dict[str, Any]] = json.loads(payload)["results"]
    for result in results:
        if result["status"] != expected:
            raise BenchError(f"http batch operation: {result['status']} {str(result['body'])[:200]}")
    return results


def run_pgbench(binary: str, db_url: URL, script: Path, clients: int, seconds: int) -> float:
    """pgbench's pairs/s; tried again a few times when the server has no connection slot left
    for its clients (a server shared with other runs)."""
    for attempt in range(4):
        try:
            return pgbench.run_pgbench(binary, db_url, script, clients, seconds).pairs_per_s
        except BenchError as error:
            if "too many clients" not in str(error) or attempt == 3:
                raise
            log("pgbench: the server has no connection slots left; trying again in 5 s")
            time.sleep(5)
    raise AssertionError("unreachable")


def run(cfg: Config) -> dict[str, Any]:
    """Every column at each client count, ``cfg.repeat`` rounds, then the paced load."""
    clients_list = cfg.hot_clients
    result: dict[str, Any] = {
        "workers": cfg.http_workers,
        "batch_size": cfg.hot_batch,
        "clients": clients_list,
        "samples": {str(c): {col: [] for col in COLUMNS} for c in clients_list},
        "load": {"start": os.getloadavg()},
    }
    with fresh_database(cfg.server_url) as db_url, tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        dsn = conninfo(db_url)
        result["postgres"] = server_version(dsn)
        engine = QuotaEngine.from_url(db_url, pool_size=2)
        try:
            setup_engine(engine, 1)
            from quota_ledger.runtime import tokens

            token = tokens.add(engine, "bench", "service")
        finally:
            engine.close()
        script = Path(tmp) / "pair_hot.sql"
        script.write_text(pgbench.pgbench_script("hot", 1, config_version(dsn)))
        base = stack.enter_context(
            service_process(db_url, cfg.http_workers, batching="true", pool_size=str(SERVICE_POOL))
        )
        pick = queue_picker("hot", 1)
        batches = Batches()
        for round_ in range(cfg.repeat):
            vacuum(dsn)
            for clients in clients_list:
                seed = 7919 * round_ + 31 * clients
                found: dict[str, float] = {
                    "library": library_pairs(db_url, clients, seed, cfg, batching=False, batches=batches),
                    "batching": library_pairs(db_url, clients, seed, cfg, batching=True, batches=batches),
                    "service": http_pairs(base, token, pick, clients, cfg.warmup, cfg.seconds),
                    "batch": batch_pairs(base, token, clients, cfg.hot_batch, cfg.warmup, cfg.seconds),
                }
                if cfg.pgbench is not None and "pgbench" in cfg.implementations:
                    run_pgbench(cfg.pgbench, db_url, script, clients, max(1, round(cfg.warmup)))
                    found["pgbench"] = run_pgbench(
                        cfg.pgbench, db_url, script, clients, max(1, round(cfg.seconds))
                    )
                for column, value in found.items():
                    result["samples"][str(clients)][column].append(value)
                log(
                    f"hot clients={clients:2} "
                    + ", ".join(f"{k} {v:.0f}" for k, v in found.items())
                    + " pairs/s"
                )
        result["requests_per_batch"] = batches.mean
        paced = max(5.0, cfg.seconds)
        latencies = sorted(paced_latencies(base, token, pick, 100.0, paced))
        result["paced_requests"] = len(latencies)
        result["p50_ms"] = 1000 * percentile(latencies, 0.5)
        result["p99_ms"] = 1000 * percentile(latencies, 0.99)
        log(f"hot, 100 requests/s: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms")
        stack.close()  # the same paced load on the service without batching, for comparison
        with service_process(
            db_url, cfg.http_workers, batching="false", pool_size=str(SERVICE_POOL)
        ) as plain:
            latencies = sorted(paced_latencies(plain, token, pick, 100.0, paced))
        result["plain_p50_ms"] = 1000 * percentile(latencies, 0.5)
        result["plain_p99_ms"] = 1000 * percentile(latencies, 0.99)
        p50, p99 = result["plain_p50_ms"], result["plain_p99_ms"]
        log(f"hot, 100 requests/s, no batching: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        engine = QuotaEngine.from_url(db_url, pool_size=2)
        try:
            result["audit"] = [str(d) for d in engine.audit()]
        finally:
            engine.close()
    result["load"]["end"] = os.getloadavg()
    result["medians"] = {
        str(c): {col: median(v) if v else None for col, v in result["samples"][str(c)].items()}
        for c in clients_list
    }
    return result
