"""Waiting for capacity: how soon a waiting request is granted once capacity frees, and a hot
queue whose clients wait in line against the same clients retrying with backoff.

Grant latency: ``GRANT_WAITERS`` callers of one engine block in ``reserve(wait=...)`` on a queue
whose capacity is held, one unit per reservation, by another engine in a process of its own (as
another service would hold it); that engine rolls the holders back one at a time,
``FREE_EVERY`` seconds apart, and each latency is from the start of a rollback call (which
includes the rollback itself) to the return of the call it granted (the k-th grant answers the
k-th rollback: the line is first-in first-out; both processes read the system's monotonic
clock). Targets: on PostgreSQL
(notices) p99 under 20 ms; on MariaDB and SQLite (polling) within the poll interval plus 20 ms.

Hot queue: ``HOT_CLIENTS`` threads cycle on a queue of ``HOT_LIMIT`` units (reserve one unit,
hold it ``HOLD`` seconds, commit, release); waiting, each reserve waits in line; retrying, a
refused reserve sleeps (exponential backoff with jitter) and tries again. Useful throughput is
cycles per second; statements are everything the engines sent, per grant (per cycle).
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL

from benchmarks.database import fresh_database, fresh_mariadb_database, fresh_sqlite_database
from benchmarks.harness import BenchError, log, median
from benchmarks.settings import Config
from quota_ledger import OverQuota, QuotaEngine

QUEUE = "root.wait"
GRANT_WAITERS = 100
FREE_EVERY = 0.05
POLL = 0.25
HOT_CLIENTS = 64
HOT_LIMIT = 8
HOLD = 0.005
BACKOFF_FIRST, BACKOFF_CAP = 0.001, 0.1
TARGET_P99_MS = 20.0


def _prepared(db_url: URL, limit: int) -> None:
    setup = QuotaEngine.from_url(db_url)
    try:
        setup.migrate()
        setup.set_limits(QUEUE, {"vcore": limit})
    finally:
        setup.close()


def _holder(url: str, ready: Any, go: Any, freed: Any) -> None:
    """The holder's process: hold ``GRANT_WAITERS`` units, then roll them back one at a time,
    ``FREE_EVERY`` seconds apart, once told to; put the start of each rollback call
    (``time.perf_counter``, the system's monotonic clock) on ``freed``."""
    holder = QuotaEngine.from_url(url)
    try:
        held = [holder.reserve(QUEUE, {"vcore": 1}, ttl=600) for _ in range(GRANT_WAITERS)]
        ready.put(True)
        go.get()
        starts = []
        for reservation in held:
            # from the call that frees, not its return: the call itself may grant, before it returns
            starts.append(time.perf_counter())
            holder.rollback(reservation.id)
            time.sleep(FREE_EVERY)
        freed.put(starts)
    finally:
        holder.close()


def grant_latency(db_url: URL) -> dict[str, float]:
    """One round: p50 and p99 of the grant latency, ms. The holder runs in a process of its
    own, as a service that frees capacity would; the waiters' engine in this one."""
    context = multiprocessing.get_context("spawn")
    ready, go, freed_q = context.Queue(), context.Queue(), context.Queue()
    holder = context.Process(
        target=_holder, args=(db_url.render_as_string(hide_password=False), ready, go, freed_q)
    )
    holder.start()
    waiter = QuotaEngine.from_url(db_url, pool_size=10, wait_poll_interval=POLL)
    try:
        ready.get(timeout=120)
        done: list[float] = []
        granted: list[str] = []
        failures: list[BaseException] = []

        def wait() -> None:
            try:
                granted.append(waiter.reserve(QUEUE, {"vcore": 1}, wait=120, ttl=600).id)
                done.append(time.perf_counter())
            except BaseException as error:  # reported below
                failures.append(error)

        threads = [threading.Thread(target=wait) for _ in range(GRANT_WAITERS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while len(waiter.waiting(QUEUE)) < GRANT_WAITERS:
            if time.monotonic() > deadline or failures:
                raise BenchError(f"the waiters did not all join the line: {failures[:1]}")
            time.sleep(0.05)
        go.put(True)
        freed: list[float] = freed_q.get(timeout=120)
        for thread in threads:
            thread.join(timeout=60)
        if failures or len(done) != GRANT_WAITERS:
            raise BenchError(f"{len(done)} of {GRANT_WAITERS} waiters granted: {failures[:1]}")
        latencies = sorted((d - f) * 1000 for d, f in zip(sorted(done), freed, strict=True))
        audit = waiter.audit()
        if audit:
            raise BenchError(f"audit found drifts: {audit[:3]}")
        for rid in granted:  # the next round starts from an empty queue
            waiter.rollback(rid)
        return {
            "p50_ms": latencies[len(latencies) // 2],
            "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        }
    finally:
        waiter.close()
        holder.join(timeout=60)
        if holder.is_alive():
            holder.kill()


class _Statements:
    """Counts the statements an engine sends to the database: every statement run on a cursor
    of its connections (``SAVEPOINT`` and the like included), whether SQLAlchemy runs it or the
    driver runs it on the psycopg connection (the ledger's function calls); an executemany
    counts each of its parameter sets. ``BEGIN`` and ``COMMIT`` are not counted."""

    def __init__(self, engine: QuotaEngine) -> None:
        self.count = 0
        self._lock = threading.Lock()
        event.listen(engine.driver.engine, "connect", self._connected)

    def _connected(self, dbapi_connection: Any, _record: Any) -> None:
        counted = self
        base = dbapi_connection.cursor_factory

        class CountingCursor(base):  # type: ignore[misc, valid-type]
            def execute(self, *args: Any, **kwargs: Any) -> Any:
                counted.add(1)
                return super().execute(*args, **kwargs)

            def executemany(self, query: Any, params_seq: Any, *args: Any, **kwargs: Any) -> Any:
                params_seq = list(params_seq)
                counted.add(len(params_seq))
                return super().executemany(query, params_seq, *args, **kwargs)

        dbapi_connection.cursor_factory = CountingCursor

    def add(self, n: int) -> None:
        with self._lock:
            self.count += n


def hot_queue(db_url: URL, waiting: bool, seconds: float, warmup: float) -> dict[str, float]:
    """One round of the hot queue: cycles/s, statements per cycle, and (waiting) the share of
    grants out of arrival order."""
    engine = QuotaEngine.from_url(db_url, pool_size=HOT_CLIENTS + 4, wait_poll_interval=POLL)
    sent = _Statements(engine)
    stop = threading.Event()
    counting = threading.Event()
    cycles = [0] * HOT_CLIENTS
    failures: list[BaseException] = []

    def reserve(rng: random.Random) -> str:
        if waiting:
            return engine.reserve(QUEUE, {"vcore": 1}, wait=60, ttl=60).id
        pause = BACKOFF_FIRST
        while True:
            try:
                return engine.reserve(QUEUE, {"vcore": 1}, ttl=60).id
            except OverQuota:
                time.sleep(pause * rng.random())
                pause = min(BACKOFF_CAP, pause * 2)

    def client(n: int) -> None:
        rng = random.Random(n)
        try:
            while not stop.is_set():
                rid = reserve(rng)
                time.sleep(HOLD)
                engine.commit(rid)
                engine.release_reservation(rid)
                if counting.is_set():
                    cycles[n] += 1
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(HOT_CLIENTS)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(warmup)
        before = sent.count
        counting.set()
        started = time.perf_counter()
        time.sleep(seconds)
        counting.clear()
        elapsed = time.perf_counter() - started
        statements = sent.count - before
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        if failures:
            raise BenchError(f"a hot-queue client failed: {failures[0]!r}")
        done = sum(cycles)
        out_of_order = _out_of_order(engine) if waiting else 0.0
        audit = engine.audit()
        if audit:
            raise BenchError(f"audit found drifts: {audit[:3]}")
    finally:
        stop.set()
        engine.close()
    return {
        "cycles_per_s": done / elapsed,
        "statements_per_grant": statements / done if done else float("inf"),
        "out_of_order": out_of_order,
    }


def _out_of_order(engine: QuotaEngine) -> float:
    """Of the requests that waited, the share granted before one that joined the line earlier."""
    from sqlalchemy import select

    from quota_ledger.driver.schema import reservations as r

    with engine.driver.engine.connect() as conn:
        rows = conn.execute(
            select(r.c.queued_at, r.c.created_at)
            .where(r.c.queued_at.is_not(None), r.c.ttl_ms.is_(None))
            .order_by(r.c.created_at, r.c.id)
        ).all()
    latest, late = None, 0
    for queued, _granted in rows:
        if latest is not None and queued < latest:
            late += 1
        latest = queued if latest is None else max(latest, queued)
    return late / len(rows) if rows else 0.0


def _rounds(cfg: Config, make: Callable[[], dict[str, float]]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for _ in range(cfg.repeat):
        for name, value in make().items():
            found.setdefault(name, []).append(value)
    return found


def run(cfg: Config) -> dict[str, Any]:
    """Grant latency on each backend, then the hot queue on PostgreSQL, waiting and retrying
    side by side in each round."""
    result: dict[str, Any] = {"latency": {}, "hot": {}}
    databases: dict[str, Callable[[], AbstractContextManager[URL]]] = {
        "postgresql": lambda: fresh_database(cfg.server_url),
        "mariadb": lambda: fresh_mariadb_database(cfg.mariadb_url),
        "sqlite": fresh_sqlite_database,
    }
    for backend, fresh in databases.items():
        with fresh() as db_url:
            _prepared(db_url, GRANT_WAITERS)
            rounds = _rounds(cfg, partial(grant_latency, db_url))
        result["latency"][backend] = {name: median(values) for name, values in rounds.items()}
        result["latency"][backend]["rounds"] = rounds
        log(f"waiting {backend:10} grant latency {result['latency'][backend]}")
    with fresh_database(cfg.server_url) as db_url:
        _prepared(db_url, HOT_LIMIT)
        samples: dict[str, dict[str, list[float]]] = {"waiting": {}, "retrying": {}}
        for _ in range(cfg.repeat):
            for mode in ("waiting", "retrying"):
                for name, value in hot_queue(db_url, mode == "waiting", cfg.seconds, cfg.warmup).items():
                    samples[mode].setdefault(name, []).append(value)
        for mode, found in samples.items():
            result["hot"][mode] = {name: median(values) for name, values in found.items()}
            result["hot"][mode]["rounds"] = found
            log(f"waiting hot queue {mode}: {result['hot'][mode]}")
    return result


def section(result: dict[str, Any]) -> list[str]:
    """The report's tables: grant latency per backend, then the hot queue."""
    lines = [
        "",
        f"### waiting for capacity: grant latency, {GRANT_WAITERS} waiters, one unit freed every "
        f"{FREE_EVERY * 1000:.0f} ms by another engine (median of the rounds' p50 and p99)",
        "",
        "| backend | wake-up | p50 ms | p99 ms | target |",
        "|---|---|--:|--:|--:|",
    ]
    for backend, found in result["latency"].items():
        notices = backend == "postgresql"
        target = TARGET_P99_MS if notices else POLL * 1000 + TARGET_P99_MS
        mark = "✓" if found["p99_ms"] < target else "✗"
        how = "notice" if notices else f"poll {POLL * 1000:.0f} ms"
        p50, p99 = found["p50_ms"], found["p99_ms"]
        lines.append(f"| {backend} | {how} | {p50:.1f} | {p99:.1f} | < {target:g} {mark} |")
    waiting, retrying = result["hot"]["waiting"], result["hot"]["retrying"]
    faster = waiting["cycles_per_s"] / retrying["cycles_per_s"]
    fewer = retrying["statements_per_grant"] / waiting["statements_per_grant"]
    lines += [
        "",
        f"Hot queue on PostgreSQL: {HOT_CLIENTS} clients, {HOT_LIMIT} units, each cycle reserves one, "
        f"holds it {HOLD * 1000:.0f} ms, commits and releases it:",
        "",
        "| clients | cycles/s | statements per grant | grants out of arrival order |",
        "|---|--:|--:|--:|",
        f"| waiting in line | {waiting['cycles_per_s']:.0f} | {waiting['statements_per_grant']:.1f} "
        f"| {waiting['out_of_order']:.1%} |",
        f"| retrying with backoff | {retrying['cycles_per_s']:.0f} "
        f"| {retrying['statements_per_grant']:.1f} | - |",
        "",
        f"Waiting / retrying: throughput {faster:.2f}x, {fewer:.1f}x fewer statements per grant.",
    ]
    return lines
