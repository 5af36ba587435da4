"""``set_limits`` on one queue at 100, 10,000 and 100,000 configured queues: the per-call median
must not grow with the configuration (target: 100,000 vs 100 <= 1.5x).

Each size gets a database of its own with one ``apply_config`` of a generated tree: root, 10
departments with a max each, and the rest as teams under them (leaves, without a max at first).
Then, in each round, every size in turn times ``SET_LIMITS_CALLS`` calls one at a time, each
setting a different team's vcore and memory (the first call on a team adds its limits, a later
one changes them). A few calls before the first round build each engine's check index, which
a process builds once. Finally ``sequence`` consecutive calls at the largest size give the rate
at which limits can be set on 100,000 queues one call at a time.
"""

from __future__ import annotations

import random
import statistics
import time
from contextlib import ExitStack
from typing import Any

from benchmarks.database import fresh_database
from benchmarks.harness import log
from benchmarks.settings import Config
from quota_ledger import QuotaEngine

TARGET_SET_LIMITS_COST = 1.5
SIZES = (100, 10_000, 100_000)
SET_LIMITS_CALLS = 200
DEPARTMENTS = 10
WARM_CALLS = 5


def document(queues: int) -> dict[str, Any]:
    """root, ``DEPARTMENTS`` departments with a max, and teams under them up to ``queues``."""
    teams = max(0, queues - DEPARTMENTS - 1)
    departments = []
    for d in range(DEPARTMENTS):
        count = teams // DEPARTMENTS + (1 if d < teams % DEPARTMENTS else 0)
        department: dict[str, Any] = {
            "name": f"d{d}",
            "resources": {"max": {"vcore": "1000", "memory": "1Ti"}},
        }
        if count:
            department["queues"] = [{"name": f"t{t}"} for t in range(count)]
        departments.append(department)
    return {"partitions": [{"name": "default", "queues": [{"name": "root", "queues": departments}]}]}


def team(queues: int, n: int) -> str:
    """The path of the ``n``-th team (teams are dealt round-robin over the departments)."""
    teams = max(1, queues - DEPARTMENTS - 1)
    n %= teams
    return f"root.d{n % DEPARTMENTS}.t{n // DEPARTMENTS}"


def timed_calls(engine: QuotaEngine, queues: int, start: int, calls: int, rng: random.Random) -> list[float]:
    """Seconds of each of ``calls`` set_limits calls on consecutive teams from ``start``."""
    seconds = []
    for n in range(start, start + calls):
        limits = {"vcore": rng.randint(1, 500), "memory": rng.randint(1, 1024) * 2**30}
        began = time.perf_counter()
        engine.set_limits(team(queues, n), limits)
        seconds.append(time.perf_counter() - began)
    return seconds


def run(cfg: Config, sequence: int) -> dict[str, Any]:
    """Per-call medians at each size, round after round, then ``sequence`` calls in a row."""
    result: dict[str, Any] = {"calls": SET_LIMITS_CALLS, "sizes": list(SIZES), "setup_s": {}, "rounds": []}
    rng = random.Random(7)
    with ExitStack() as stack:
        engines: dict[int, QuotaEngine] = {}
        for size in SIZES:
            url = stack.enter_context(fresh_database(cfg.server_url))
            engine = stack.enter_context(QuotaEngine.from_url(url, pool_size=2))
            engine.migrate()
            began = time.perf_counter()
            engine.apply_config(document(size))
            result["setup_s"][size] = time.perf_counter() - began
            began = time.perf_counter()
            timed_calls(engine, size, 0, WARM_CALLS, rng)  # builds the engine's check index
            result.setdefault("first_calls_s", {})[size] = time.perf_counter() - began
            log(f"set_limits: {size:,} queues configured in {result['setup_s'][size]:.1f} s")
            engines[size] = engine
        start = WARM_CALLS
        for round_ in range(cfg.repeat):
            medians = {}
            for size, engine in engines.items():
                medians[size] = statistics.median(timed_calls(engine, size, start, SET_LIMITS_CALLS, rng))
            start += SET_LIMITS_CALLS
            ratio = medians[SIZES[-1]] / medians[SIZES[0]]
            result["rounds"].append({"median_s": medians, "ratio": ratio})
            shown = ", ".join(f"{size:,}: {m * 1000:.2f} ms" for size, m in medians.items())
            log(f"set_limits round {round_ + 1}: per-call median {shown}; ratio {ratio:.2f}")
        largest = engines[SIZES[-1]]
        if sequence:
            began = time.perf_counter()
            timed_calls(largest, SIZES[-1], start, sequence, rng)
            elapsed = time.perf_counter() - began
            result["sequence"] = {"calls": sequence, "seconds": elapsed}
            log(f"set_limits: {sequence:,} calls in a row at {SIZES[-1]:,} queues took {elapsed:.1f} s")
        result["audit"] = [str(d) for d in largest.audit()]
        result["version"] = largest.config_version()
    result["ratio"] = statistics.median(r["ratio"] for r in result["rounds"])
    result["median_s"] = {
        size: statistics.median(r["median_s"][size] for r in result["rounds"]) for size in SIZES
    }
    return result
