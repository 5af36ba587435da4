"""A whole run, case after case, and ``main``: what ``scripts/bench`` calls."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

import psycopg
import sqlalchemy

from benchmarks import report
from benchmarks.cases import (
    admission,
    cli,
    cold,
    group_commit,
    hierarchy,
    hot,
    http,
    kube,
    set_limits,
    sweep,
    throughput,
    waiting,
)
from benchmarks.harness import BenchError, log
from benchmarks.settings import REPO, Config, parse_args


def git_commit() -> str | None:
    """The repository's short commit, for the JSON."""
    with suppress(Exception):
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        return out.stdout.strip()
    return None


def bench(cfg: Config) -> int:
    """Every case ``cfg`` asks for, then the report; 1 if an audit found drifts or the replica
    no longer sends what the library sends, else 0."""
    started = time.perf_counter()
    meta: dict[str, Any] = {
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "sqlalchemy": sqlalchemy.__version__,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "commit": git_commit(),
    }
    cells: list[throughput.Cell] = []
    sweep_result: dict[str, Any] | None = None
    if cfg.runs("throughput") or cfg.runs("sweep"):
        cells, sweep_result = throughput.run(cfg, meta)
    # In the order of CASES: group-commit comes after hot, whose PostgreSQL rounds it reads.
    side_cases: dict[str, Callable[[], Any]] = {
        "hierarchy": lambda: hierarchy.run(cfg),
        "kube": lambda: kube.run(cfg),
        "http": lambda: http.run(cfg),
        "admission": lambda: admission.run(cfg),
        "cold": lambda: cold.run(cfg),
        "hot": lambda: hot.run(cfg),
        "group-commit": lambda: group_commit.run(cfg, meta.get("hot")),
        "set-limits": lambda: set_limits.run(cfg, cfg.set_limits_sequence),
        "cli": lambda: cli.run(cfg),
        "waiting": lambda: waiting.run(cfg),
    }
    for case, run_case in side_cases.items():
        if cfg.runs(case):
            meta[case.replace("-", "_")] = run_case()
    meta["total_s"] = time.perf_counter() - started
    text = report.markdown(cfg, cells, sweep_result, meta)
    print(text)
    if cfg.json_path is not None:
        report.write_json(cfg.json_path, cfg, cells, sweep_result, meta, text)
    log(f"done in {meta['total_s']:.0f} s")
    clean = (
        not meta.get("final_audit")
        and not meta.get("hierarchy", {}).get("audit")
        and not meta.get("kube", {}).get("audit")
        and not meta.get("http", {}).get("audit")
        and not meta.get("admission", {}).get("audit")
        and not meta.get("admission", {}).get("problems")
        and not any(b["audit"] for b in meta.get("cold", {}).get("backends", {}).values())
        and not any(each["audit"] for each in meta.get("group_commit", []))
        and not meta.get("hot", {}).get("audit")
        and not meta.get("set_limits", {}).get("audit")
    )
    # A comparison with a replica that sends something else is meaningless: fail loudly.
    same_shape = meta.get("shape", {}).get("identical", True)
    return 0 if clean and same_shape else 1


def main(argv: Sequence[str]) -> int:
    """``scripts/bench``: 0 all clean, 1 drifts or a different replica, 2 could not run, 130 stopped."""

    def terminate(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    try:
        args, cfg = parse_args(argv)
        if cfg is None:
            return sweep.sweep_worker_main(args.db)
        return bench(cfg)
    except BenchError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        print(f"bench: interrupted ({interrupt or 'Ctrl-C'})", file=sys.stderr)
        return 130
