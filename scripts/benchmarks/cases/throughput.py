"""Throughput: reserve+commit pairs/s of the library, the psycopg replica and pgbench, for each
scope pattern and thread count, on one database that then hosts the expiry sweep and the final
audit (targets: library >= 0.7x psycopg and >= 0.5x pgbench)."""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from benchmarks import pgbench
from benchmarks.cases import sweep as sweep_case
from benchmarks.database import config_version, conninfo, fresh_database, server_version, vacuum
from benchmarks.harness import PairWorker, log, run_threads
from benchmarks.replica import PsycopgWorker, shape_check
from benchmarks.settings import Config
from benchmarks.workload import PATTERNS, LibraryWorker, queue_picker, setup_ledger
from quota_ledger import QuotaEngine

TARGET_VS_PSYCOPG = 0.7
TARGET_VS_PGBENCH = 0.5


@dataclass
class Cell:
    """One (scope pattern, thread count): each implementation's pairs/s, one per repeat."""

    pattern: str
    threads: int
    samples: dict[str, list[float]] = field(default_factory=dict)

    def median(self, impl: str) -> float | None:
        values = self.samples.get(impl)
        return statistics.median(values) if values else None


def measure_cell(cfg: Config, cell: Cell, engine: QuotaEngine, db_url: URL, scripts: dict[str, Path]) -> None:
    """Every implementation on the cell, ``cfg.repeat`` rounds, in the order of ``--only``."""
    pick = queue_picker(cell.pattern, cfg.scopes)
    dsn = conninfo(db_url)
    for round_ in range(cfg.repeat):
        for impl in cfg.implementations:
            seed = 7919 * round_ + 31 * cell.threads
            if impl == "library":
                workers: list[PairWorker] = [
                    LibraryWorker(engine, pick, seed + i) for i in range(cell.threads)
                ]
                sample = run_threads(workers, cfg.warmup, cfg.seconds)
            elif impl == "psycopg":
                version = config_version(dsn)
                raw = [PsycopgWorker(dsn, pick, seed + i, version) for i in range(cell.threads)]
                try:
                    sample = run_threads(raw, cfg.warmup, cfg.seconds)
                finally:
                    for worker in raw:
                        worker.close()
            else:
                assert cfg.pgbench is not None
                warm = max(1, round(cfg.warmup))
                pgbench.run_pgbench(cfg.pgbench, db_url, scripts[cell.pattern], cell.threads, warm)
                measured = max(1, round(cfg.seconds))
                sample = pgbench.run_pgbench(
                    cfg.pgbench, db_url, scripts[cell.pattern], cell.threads, measured
                )
            cell.samples.setdefault(impl, []).append(sample.pairs_per_s)
            log(f"{cell.pattern:6} threads={cell.threads:2} {impl:8} {sample.pairs_per_s:8.1f} pairs/s")


def run(cfg: Config, meta: dict[str, Any]) -> tuple[list[Cell], dict[str, Any] | None]:
    """The main database: setup, then with the throughput case the shape check and every cell,
    with the sweep case the sweep, and the final audit. Fills ``meta`` (server, setup timings,
    shape, retries, audit); returns the cells and the sweep's result."""
    cells = [Cell(pattern, threads) for pattern in PATTERNS for threads in cfg.threads]
    if not cfg.runs("throughput"):
        cells = []
    sweep: dict[str, Any] | None = None
    with fresh_database(cfg.server_url) as db_url, tempfile.TemporaryDirectory() as tmp:
        dsn = conninfo(db_url)
        meta["postgres"] = server_version(dsn)
        engine = QuotaEngine.from_url(db_url, pool_size=max([*cfg.threads, cfg.sweep_threads]) + 2)
        try:
            meta["setup"] = setup_ledger(db_url, cfg.scopes)
            if cells and "psycopg" in cfg.implementations:
                meta["shape"] = shape_check(engine, dsn)
                if not meta["shape"]["identical"]:
                    log("WARNING: the psycopg replica no longer sends what the library sends:")
                    log(f"  library: {meta['shape']['library']}")
                    log(f"  psycopg: {meta['shape']['psycopg']}")
            scripts: dict[str, Path] = {}
            for pattern in PATTERNS:
                scripts[pattern] = Path(tmp) / f"pair_{pattern}.sql"
                scripts[pattern].write_text(pgbench.pgbench_script(pattern, cfg.scopes, config_version(dsn)))
            for cell in cells:
                vacuum(dsn)
                measure_cell(cfg, cell, engine, db_url, scripts)
            meta["retries"] = dict(engine.driver.retries)
            if cfg.runs("sweep"):
                sweep = sweep_case.run_sweep(cfg, engine, db_url, dsn)
            log("audit()")
            audit_started = time.perf_counter()
            meta["final_audit"] = [str(d) for d in engine.audit()]
            meta["audit_s"] = time.perf_counter() - audit_started
            log(f"audit(): {len(meta['final_audit'])} drifts in {meta['audit_s']:.1f} s")
        finally:
            engine.close()
    return cells, sweep
