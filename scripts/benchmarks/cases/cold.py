"""First uses: reserve+commit where every reservation is the first use of a queue, an
application, a user under a wildcard user limit or a group under a wildcard group limit
(cold), side by side with the same requests on things already used (warm), on PostgreSQL,
MariaDB and SQLite (target: cold >= 0.7x warm, cold p99 < 50 ms)."""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import URL

from benchmarks.database import (
    conninfo,
    fresh_database,
    fresh_mariadb_database,
    fresh_sqlite_database,
    vacuum,
)
from benchmarks.harness import log, median, run_threads, side_by_side
from benchmarks.settings import Config
from benchmarks.workload import PARTITION, ROOT, TTL_SECONDS
from quota_ledger import QuotaEngine

TARGET_COLD = 0.7
TARGET_P99_MS = 50.0
KINDS = ("queue", "application", "user", "group")
REQUEST: dict[str, Any] = {"vcore": "1m", "memory": "1Mi"}
#: warm things per kind: queues, and users each with one application in one queue
WARM = 100
DEPARTMENTS = 10


def cold_config() -> dict[str, Any]:
    """root.org.d<N>.t<M> as in the hierarchical case, with a max and a maxapplications on
    root.org and each department, a ``*`` user limit (with maxapplications) and a ``*`` group
    limit on both. Limits are far above what a run uses: the case measures first uses."""
    big = {"vcore": "1000000", "memory": "1Pi"}
    limits = [
        {"users": ["*"], "maxresources": big, "maxapplications": 10**9},
        {"groups": [f"g{g:02d}" for g in range(20)], "maxresources": big},
        {"groups": ["*"], "maxresources": big, "maxapplications": 10**9},
    ]
    departments = [
        {
            "name": f"d{d}",
            "maxapplications": 10**9,
            "resources": {"max": big},
            "limits": limits,
            "queues": [
                {"name": f"t{t}", "maxapplications": 10**9, "resources": {"max": big}} for t in range(10)
            ],
        }
        for d in range(DEPARTMENTS)
    ]
    org = {
        "name": "org",
        "maxapplications": 10**9,
        "resources": {"max": big},
        "limits": limits,
        "queues": departments,
    }
    return {"partitions": [{"name": PARTITION, "queues": [{"name": ROOT, "queues": [org]}]}]}


def warm_queue(index: int) -> str:
    return f"root.org.d{index % DEPARTMENTS}.t{(index // DEPARTMENTS) % 10}"


class ColdWorker:
    """reserve then commit, each pair a first use of ``kind`` (``cold``) or a use of things a
    prewarm already used; records every pair's latency with the time it ended."""

    def __init__(self, engine: QuotaEngine, kind: str, cold: bool, seed: int, fresh: Iterator[int]) -> None:
        self.engine, self.kind, self.cold = engine, kind, cold
        self.rng = random.Random(seed)
        self.fresh = fresh
        #: (when it ended, seconds) of every pair, and of every call (a reserve, a commit)
        self.latencies: list[tuple[float, float]] = []
        self.calls: list[tuple[float, float]] = []

    def request(self) -> dict[str, Any]:
        """queue/user/groups/application of the next pair."""
        i = self.rng.randrange(WARM)
        warm = {"queue": warm_queue(i), "user": f"u{i:03d}", "groups": [f"g{i % 20:02d}"]}
        if self.kind == "queue":
            queue = f"root.org.d{i % DEPARTMENTS}.c{next(self.fresh)}" if self.cold else warm["queue"]
            return {"queue": queue}
        if self.kind == "application":
            app = f"cold-{next(self.fresh)}" if self.cold else f"app-{i:03d}"
            return {**warm, "application": app}
        if self.kind == "user":
            # a user's reservations without an application: a new user is a new bucket row
            # and the user's copies of the wildcard limit
            user = f"v{next(self.fresh)}" if self.cold else warm["user"]
            return {**warm, "user": user}
        # group: a new application of a warm user, tracked against a group never seen
        if self.cold:
            n = next(self.fresh)
            return {**warm, "groups": [f"h{n}"], "application": f"grp-{n}"}
        return {**warm, "application": f"app-{i:03d}"}

    def pair(self) -> None:
        args = self.request()
        queue = args.pop("queue")
        started = time.perf_counter()
        reservation = self.engine.reserve(queue, REQUEST, ttl=TTL_SECONDS, **args)
        reserved = time.perf_counter()
        self.engine.commit(reservation.id)
        ended = time.perf_counter()
        self.latencies.append((ended, ended - started))
        self.calls += [(reserved, reserved - started), (ended, ended - reserved)]

    def close(self) -> None:
        pass


def prewarm(engine: QuotaEngine) -> None:
    """Use every warm queue, user, group and application once (each kind's warm case)."""
    for i in range(WARM):
        queue, user, groups = warm_queue(i), f"u{i:03d}", [f"g{i % 20:02d}"]
        application = f"app-{i:03d}"
        engine.commit(engine.reserve(queue, REQUEST, ttl=TTL_SECONDS).id)
        engine.commit(engine.reserve(queue, REQUEST, ttl=TTL_SECONDS, user=user, groups=groups).id)
        engine.commit(
            engine.reserve(
                queue, REQUEST, ttl=TTL_SECONDS, user=user, groups=groups, application=application
            ).id
        )


def measure(
    cfg: Config, engine: QuotaEngine, kind: str, cold: bool, seed: int, fresh: Iterator[int]
) -> dict[str, float]:
    """One window: pairs/s, and the p99 latency (ms) of the calls (each reserve, each commit)
    and of the pairs that ended inside it."""
    workers = [ColdWorker(engine, kind, cold, seed + i, fresh) for i in range(cfg.side_threads)]
    begun = time.perf_counter()
    sample = run_threads(workers, cfg.warmup, cfg.seconds)

    def p99(timed: list[tuple[float, float]]) -> float:
        inside = sorted(lat for ended, lat in timed if ended >= begun + cfg.warmup)
        return inside[min(len(inside) - 1, int(len(inside) * 0.99))] * 1000 if inside else float("nan")

    return {
        "pairs_per_s": sample.pairs_per_s,
        "p99_ms": p99([c for w in workers for c in w.calls]),
        "pair_p99_ms": p99([p for w in workers for p in w.latencies]),
    }


class _Counter:
    """Fresh numbers for every thread (itertools.count under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = itertools.count()

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        with self._lock:
            return next(self._count)


@contextmanager
def backend_database(cfg: Config, backend: str) -> Iterator[tuple[URL, Callable[[], None]]]:
    """A fresh database of ``backend`` and what to run between rounds."""
    if backend == "postgresql":
        with fresh_database(cfg.server_url) as url:
            yield url, lambda: vacuum(conninfo(url))
    elif backend == "mariadb":
        with fresh_mariadb_database(cfg.mariadb_url) as url:
            yield url, lambda: None
    else:
        with fresh_sqlite_database() as url:
            yield url, lambda: None


def run_backend(cfg: Config, backend: str) -> dict[str, Any]:
    """Every kind, warm then cold, ``cfg.repeat`` rounds, on one fresh database."""
    threads = cfg.side_threads
    out: dict[str, Any] = {"threads": threads, "batching": cfg.cold_batching, "kinds": {}}
    with backend_database(cfg, backend) as (url, between):
        engine = QuotaEngine.from_url(url, pool_size=threads + 2, batching=cfg.cold_batching)
        try:
            engine.migrate()
            engine.apply_config(cold_config())
            started = time.perf_counter()
            prewarm(engine)
            out["prewarm_s"] = time.perf_counter() - started
            fresh = _Counter()
            for kind in KINDS:
                rows: dict[str, list[dict[str, float]]] = {"warm": [], "cold": []}
                rounds = side_by_side(
                    cfg.repeat,
                    between,
                    _window(cfg, engine, kind, False, fresh, rows["warm"]),
                    _window(cfg, engine, kind, True, fresh, rows["cold"]),
                )
                for warm, cold in rounds:
                    log(f"{backend:10} {kind:11} warm {warm:8.1f} cold {cold:8.1f} pairs/s")
                out["kinds"][kind] = summarize(rows)
            out["audit"] = [str(d) for d in engine.audit()]
            out["retries"] = dict(engine.driver.retries)
        finally:
            engine.close()
    return out


def _window(
    cfg: Config,
    engine: QuotaEngine,
    kind: str,
    cold: bool,
    fresh: Iterator[int],
    into: list[dict[str, float]],
) -> Callable[[int], float]:
    """One side of a round: measure a window, keep its sample, return its pairs/s."""

    def window(round_: int) -> float:
        sample = measure(cfg, engine, kind, cold, (103 if cold else 101) * round_, fresh)
        into.append(sample)
        return sample["pairs_per_s"]

    return window


def summarize(rows: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Medians of the rounds: pairs/s and p99 of each case, and cold/warm."""
    warm = median(r["pairs_per_s"] for r in rows["warm"])
    cold = median(r["pairs_per_s"] for r in rows["cold"])
    return {
        "warm": warm,
        "cold": cold,
        "ratio": cold / warm if warm else 0.0,
        "warm_p99_ms": median(r["p99_ms"] for r in rows["warm"]),
        "cold_p99_ms": median(r["p99_ms"] for r in rows["cold"]),
        "cold_pair_p99_ms": median(r["pair_p99_ms"] for r in rows["cold"]),
        "samples": rows,
    }


def run(cfg: Config) -> dict[str, Any]:
    """The case on each backend of ``cfg.cold_backends``, with the load average before and after."""
    result: dict[str, Any] = {"load_before": os.getloadavg(), "backends": {}}
    for backend in cfg.cold_backends:
        result["backends"][backend] = run_backend(cfg, backend)
    result["load_after"] = os.getloadavg()
    return result
