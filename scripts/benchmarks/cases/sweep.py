"""The expiry sweep under load: stale pending reservations expired by ``QuotaEngine.expire()``
in a process of its own (as a sweeper would run) while library threads reserve and commit,
against windows without a sweep right before and right after (targets: < 10 s, >= 0.8x)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import suppress
from typing import Any

import psycopg
from sqlalchemy.engine import URL

from benchmarks.database import vacuum
from benchmarks.harness import BenchError, PairWorker, log, median, run_threads
from benchmarks.settings import SCRIPT, Config
from benchmarks.workload import AMOUNTS, PARTITION, LibraryWorker, queue_picker
from quota_ledger import QuotaEngine

TARGET_SWEEP_RATIO = 0.8
TARGET_SWEEP_SECONDS = 10.0

STALE_SQL = """
WITH r AS (
    INSERT INTO reservations (id, partition, key, request_hash, state, queue, user_name, groups,
                              application, priority_class, created_at, expires_at, resolved_at)
    SELECT gen_random_uuid()::text, %(p)s, NULL, md5(g::text) || md5((-g)::text), 'pending',
           'root.p' || lpad((g %% %(scopes)s)::text, 5, '0'), NULL, NULL, NULL, NULL,
           t.now - interval '1 hour' - g * interval '1 millisecond' - interval '300 seconds',
           t.now - interval '1 hour' - g * interval '1 millisecond', NULL
    FROM generate_series(0, %(n)s - 1) AS g,
         (SELECT TIMEZONE('UTC', clock_timestamp()) AS now) AS t
    RETURNING id, queue
), i AS (
    INSERT INTO reservation_items (reservation_id, resource, amount, committed)
    SELECT r.id, v.resource, v.amount, NULL
    FROM r CROSS JOIN (VALUES ('fpga', %(fpga)s::bigint), ('memory', %(memory)s::bigint))
           AS v(resource, amount)
    RETURNING reservation_id, resource, amount
), sums AS (
    SELECT r.queue, i.resource, sum(i.amount) AS total
    FROM i JOIN r ON r.id = i.reservation_id
    GROUP BY r.queue, i.resource
), charged AS (
    -- the queue counter and the limit on the queue itself ...
    SELECT u.id, s.total FROM quota_usages u
    JOIN sums s ON u.scope = s.queue AND u.resource = s.resource
    WHERE u.partition = %(p)s
    UNION ALL
    -- ... and a limit on root, the only ancestor of root.pNNNNN, if there is one
    SELECT u.id, s.total FROM quota_usages u
    JOIN sums s ON u.resource = s.resource
    WHERE u.partition = %(p)s AND u.scope_type = 'subtree' AND u.scope = 'root'
)
UPDATE quota_usages u
SET reserved = u.reserved + c.total, updated_at = TIMEZONE('UTC', clock_timestamp())
FROM (SELECT id, sum(total) AS total FROM charged GROUP BY id) AS c
WHERE u.id = c.id
"""


def insert_stale(dsn: str, rows: int, scopes: int) -> float:
    """Bulk-insert ``rows`` pending reservations that expired an hour ago, spread over the
    scopes, and add their amounts to ``reserved`` of every counter they are charged to (as
    the library's reserve would have): the ledger stays consistent and audit() stays clean."""
    started = time.perf_counter()
    with psycopg.connect(dsn) as conn:
        conn.execute(
            STALE_SQL,
            {"p": PARTITION, "n": rows, "scopes": scopes, **AMOUNTS},
        )
        conn.commit()
    # After a bulk load autovacuum would analyze soon; do it now so plans are the usual ones.
    vacuum(dsn)
    checkpoint(dsn)
    return time.perf_counter() - started


def checkpoint(dsn: str) -> None:
    """A checkpoint now, not one the bulk load's WAL (about half of max_wal_size on a default
    server) starts at a random point of the measured windows: the windows around the sweep
    all start right after a checkpoint instead. The sweep then pays a full-page image for
    every page it touches, which is its worst case."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        log("sweep: CHECKPOINT needs superuser or pg_checkpoint: a checkpoint may fall in a window")


def sweep_worker_main(url: str) -> int:
    """Child process: wait for "go" on stdin, run QuotaEngine.expire(), print the result."""
    workers = int(os.environ.get("QUOTA_LEDGER_BENCH_SWEEP_WORKERS", "1"))
    batch = int(os.environ.get("QUOTA_LEDGER_BENCH_SWEEP_BATCH", "500"))
    rate_text = os.environ.get("QUOTA_LEDGER_BENCH_SWEEP_MAX_RATE", "")
    max_rate = float(rate_text) if rate_text else None
    engine = QuotaEngine.from_url(url, pool_size=workers + 1)
    # Before the clock starts, what a running sweeper has long done: connect, and compile the
    # configuration in force (10,000 queues: about 0.5 s of this process's CPU, once).
    engine.driver.partitions()
    engine.resource_quotas()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    started = time.perf_counter()
    expired = engine.expire(batch_size=batch, workers=workers, max_rate=max_rate)
    elapsed = time.perf_counter() - started
    print(json.dumps({"expired": expired, "seconds": elapsed}), flush=True)
    engine.close()
    return 0


def run_sweep(cfg: Config, engine: QuotaEngine, db_url: URL, dsn: str) -> dict[str, Any]:
    """The sweep ``cfg.repeat`` times, each on fresh stale reservations between baselines of its
    own; medians and every run."""
    runs = []
    for index in range(cfg.repeat):
        if index:
            vacuum(dsn)
        runs.append(sweep_once(cfg, engine, db_url, dsn))
    result = dict(runs[0])
    for key in ("sweep_s", "ratio", "baseline_pairs_per_s", "during_pairs_per_s", "during_window_s"):
        result[key] = median(run[key] for run in runs)
    result["finished"] = all(run["finished"] for run in runs)
    result["expired"] = min(run["expired"] for run in runs)
    result["expired_pending_left"] = max(run["expired_pending_left"] for run in runs)
    result["rows_per_s"] = result["expired"] / result["sweep_s"] if result["sweep_s"] > 0 else 0.0
    kept = (
        "sweep_s",
        "ratio",
        "before_pairs_per_s",
        "after_pairs_per_s",
        "baseline_pairs_per_s",
        "during_pairs_per_s",
        "finished",
    )
    result["runs"] = [{key: run[key] for key in kept} for run in runs]
    return result


def sweep_once(cfg: Config, engine: QuotaEngine, db_url: URL, dsn: str) -> dict[str, Any]:
    """One sweep: load stale rows, a baseline window, the sweep under load, a second baseline."""
    result: dict[str, Any] = {
        "rows": cfg.sweep_rows,
        "load_threads": cfg.sweep_threads,
        "workers": cfg.sweep_workers,
        "batch_size": cfg.sweep_batch,
        "max_rate": cfg.sweep_max_rate,
    }
    log(f"sweep: inserting {cfg.sweep_rows:,} stale pending reservations")
    result["insert_s"] = insert_stale(dsn, cfg.sweep_rows, cfg.scopes)
    log(f"sweep: inserted in {result['insert_s']:.1f} s")
    if cfg.scopes <= 2000:  # audit() costs O(limits x history): only on small runs
        drifts = engine.audit()
        result["audit_before"] = [str(d) for d in drifts]
        if drifts:
            raise BenchError(f"the stale reservations left the ledger inconsistent: {drifts[:3]}")

    pick = queue_picker("spread", cfg.scopes)

    def library_workers() -> list[PairWorker]:
        return [LibraryWorker(engine, pick, 1000 + i) for i in range(cfg.sweep_threads)]

    log(f"sweep: {cfg.sweep_threads}-thread library baseline without a sweep")
    window = cfg.sweep_baseline_seconds
    before = run_threads(library_workers(), cfg.warmup, window)

    # The URL goes through the environment, not the command line, in case it holds a password.
    env = {
        **os.environ,
        "QUOTA_LEDGER_BENCH_POSTGRES_URL": db_url.render_as_string(hide_password=False),
        "QUOTA_LEDGER_BENCH_SWEEP_WORKERS": str(cfg.sweep_workers),
        "QUOTA_LEDGER_BENCH_SWEEP_BATCH": str(cfg.sweep_batch),
        "QUOTA_LEDGER_BENCH_SWEEP_MAX_RATE": "" if cfg.sweep_max_rate is None else str(cfg.sweep_max_rate),
    }
    child = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--sweep-worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    timeout = cfg.sweep_timeout
    killed = threading.Event()

    def kill_child() -> None:
        killed.set()
        child.kill()

    startup = threading.Timer(120.0, kill_child)  # imports and a first connection
    startup.start()
    watchdog = threading.Timer(timeout, kill_child)
    outcome: dict[str, Any] = {}
    try:
        assert child.stdin is not None
        assert child.stdout is not None
        ready = child.stdout.readline().strip() == "ready"
        startup.cancel()
        if not ready:
            raise BenchError("the sweep process did not start")

        def sweep() -> None:
            assert child.stdin is not None
            assert child.stdout is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            started = time.perf_counter()
            watchdog.start()
            line = child.stdout.readline()
            if line:
                outcome.update(json.loads(line))
            elif killed.is_set():  # report how far it got: every batch is its own transaction
                outcome.update(timed_out=True, seconds=time.perf_counter() - started)

        log(
            f"sweep: expire() in its own process with {cfg.sweep_threads} library threads running "
            f"(stopped after {timeout:.0f} s)"
        )
        during = run_threads(library_workers(), cfg.warmup, 0.0, during=sweep)
    finally:
        startup.cancel()
        watchdog.cancel()
        with suppress(Exception):
            child.wait(timeout=30)
        if child.poll() is None:
            child.kill()
    if not outcome:
        raise BenchError("the sweep process failed")
    # The baseline is the mean of a window right before and one right after (see
    # SWEEP_BASELINE_SECONDS): one window alone drifts with the machine.
    log(f"sweep: {cfg.sweep_threads}-thread library baseline after the sweep")
    after = run_threads(library_workers(), cfg.warmup, window)
    result["before_pairs_per_s"] = before.pairs_per_s
    result["after_pairs_per_s"] = after.pairs_per_s
    result["baseline_pairs_per_s"] = baseline = (before.pairs_per_s + after.pairs_per_s) / 2
    result["finished"] = not outcome.get("timed_out", False)
    if not result["finished"]:
        log(f"sweep: stopped after {timeout:.0f} s (--sweep-timeout)")
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FROM reservations WHERE state = 'expired'").fetchone()
        outcome["expired"] = int(row[0]) if row else 0
    result["expired"] = int(outcome["expired"])
    result["sweep_s"] = float(outcome["seconds"])
    result["rows_per_s"] = result["expired"] / result["sweep_s"] if result["sweep_s"] > 0 else 0.0
    result["during_pairs_per_s"] = during.pairs_per_s
    result["during_window_s"] = during.seconds
    result["ratio"] = during.pairs_per_s / baseline if baseline else 0.0
    with psycopg.connect(dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM reservations WHERE state = 'pending' "
            "AND expires_at <= TIMEZONE('UTC', clock_timestamp())"
        ).fetchone()
    result["expired_pending_left"] = int(left[0]) if left else -1
    log(
        f"sweep: {result['expired']:,} expired in {result['sweep_s']:.2f} s; load "
        f"{during.pairs_per_s:.0f} pairs/s vs {baseline:.0f} without "
        f"({before.pairs_per_s:.0f} before, {after.pairs_per_s:.0f} after)"
    )
    return result
