"""A fault-injection run: random traffic from many threads while backends are terminated, the
database is restarted and killed, and the HTTP service is killed; then every invariant.

Shared by ``tests/faults`` (a short run) and ``scripts/chaos`` (a long one). A run is a list
of :class:`Phase` s on one fresh database of a :class:`~pg_cluster.PgCluster`; each phase
drives the library in-process or the service (``quota-ledger serve`` in a subprocess) over
HTTP, and injects its :class:`Fault` s at fixed moments. Callers retry what the ledger called
unavailable (and, over HTTP, a service they cannot reach) with the same key or reservation
id, as a real client would; the time from each fault until every caller was served again is
measured.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
import psycopg
from chaos_books import COMMITTED, RESERVED, Books, Tracked, check, read_tables
from chaos_callers import (
    OK,
    REFUSED,
    RETRY,
    SERVED,
    STATE,
    Caller,
    HttpCaller,
    LibraryCaller,
    Reply,
)
from chaos_report import FaultRecord, Report, Stats, recovery
from pg_cluster import PgCluster, free_port

from quota_ledger import DatabaseUnavailable, QuotaEngine
from quota_ledger.runtime import tokens

T = TypeVar("T")

#: tight limits, so that refusals are common and an overshoot would show
LIMITS = {
    "root.t": {"fpga": 20, "memory": 80},
    "root.t.a": {"fpga": 12},
    "root.t.b": {"fpga": 12},
    "root.c": {"fpga": 10, "memory": 40},
}
QUEUES = ("root.t.a", "root.t.b", "root.c")
SHORT_TTL, LONG_TTL = 1.5, 300.0
FAULT_KINDS = ("restart", "kill_postmaster", "kill_service")


@dataclass(frozen=True)
class Fault:
    at: float  # seconds into the phase
    kind: str  # one of FAULT_KINDS


@dataclass(frozen=True)
class Phase:
    name: str
    mode: str  # "library", "batching" (the library with batching=True) or "http"
    seconds: float
    faults: tuple[Fault, ...] = ()
    #: terminate every backend at random intervals in this range (seconds); None: never
    terminate: tuple[float, float] | None = (0.1, 0.3)


class Service:
    """``quota-ledger serve`` in a subprocess on a fixed loopback port, to be killed and started."""

    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        env = {
            **os.environ,
            "QUOTA_LEDGER_DB": self.url,
            "QUOTA_LEDGER_PORT": str(self.port),
            "QUOTA_LEDGER_SWEEP_INTERVAL": "0.5",
        }
        command = [sys.executable, "-c", "import sys; from quota_ledger.cli import main; sys.exit(main())"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([*command, "serve", "--no-migrate"], env=env, stdout=out, stderr=out)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the service did not start; see {self.log}")
            time.sleep(0.05)

    def kill(self) -> None:
        """``kill -9`` of the service process."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


class Worker:
    """One caller: random operations on reservations it holds, retried with the same key."""

    def __init__(self, name: str, caller: Caller, books: Books, stats: Stats, rng: random.Random) -> None:
        self.name, self.caller, self.books, self.stats, self.rng = name, caller, books, stats, rng
        self.pending: list[Tracked] = []
        self.committed: list[Tracked] = []
        self.give_up_after = 60.0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()
        # Leave nothing held, so the next phase starts with room under the limits.
        while self.pending:
            self.rollback(self.pending.pop())
        while self.committed:
            self.release(self.committed.pop())

    def step(self) -> None:
        roll = self.rng.random()
        held = len(self.pending) + len(self.committed)
        if held == 0 or (held < 4 and roll < 0.45):
            self.reserve()
        elif self.pending and roll < 0.72:
            self.commit(self.pending.pop(self.rng.randrange(len(self.pending))))
        elif self.pending and roll < 0.82:
            self.rollback(self.pending.pop(self.rng.randrange(len(self.pending))))
        elif self.committed and roll < 0.97:
            self.release(self.committed.pop(self.rng.randrange(len(self.committed))))
        else:
            self.call("sweep", self.caller.sweep)

    def call(self, op: str, send: Callable[[], Reply]) -> Reply | None:
        """Send until served; None when the outcome is unknown (an untyped error, or unavailable
        for longer than ``give_up_after``)."""
        deadline = time.monotonic() + self.give_up_after
        while True:
            started = time.monotonic()
            reply = send()
            self.stats.record(self.name, op, reply, started, time.monotonic())
            if reply.kind in SERVED:
                return reply
            if reply.kind == RETRY and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            if reply.kind == RETRY:
                with self.stats.lock:
                    self.stats.gave_up += 1
            return None

    def reserve(self) -> None:
        queue = self.rng.choice(QUEUES)
        amounts = {"fpga": self.rng.randint(1, 3), "memory": self.rng.randint(1, 8)}
        short = self.rng.random() < 0.25
        key = uuid.uuid4().hex
        item = self.books.track(key, queue, amounts)
        reply = self.call(
            "reserve", lambda: self.caller.reserve(queue, amounts, key, SHORT_TTL if short else LONG_TTL)
        )
        if reply is None:
            self.books.in_doubt(item, "reserve")
        elif reply.kind == REFUSED:
            self.books.refuse(item)
        elif reply.kind == OK:
            item.reservation_id = reply.reservation_id
            self.books.acknowledge(item, "reserve", reply.state)
            if reply.state == RESERVED and not (short and self.rng.random() < 0.2):
                self.pending.append(item)  # the rest is left for the sweeper
        else:
            self.books.acknowledge(item, "reserve", f"refused as {reply.state}")

    def commit(self, item: Tracked) -> None:
        self._resolve("commit", item, self.caller.commit)

    def rollback(self, item: Tracked) -> None:
        self._resolve("rollback", item, self.caller.rollback)

    def release(self, item: Tracked) -> None:
        self._resolve("release", item, self.caller.release)

    def _resolve(self, op: str, item: Tracked, send: Callable[[str], Reply]) -> None:
        assert item.reservation_id is not None
        rid = item.reservation_id
        reply = self.call(op, lambda: send(rid))
        if reply is None:
            self.books.in_doubt(item, op)
            return
        state = reply.state if reply.kind in (OK, STATE) else reply.kind
        self.books.acknowledge(item, op, state, released=reply.released)
        if op == "commit" and state == COMMITTED:
            self.committed.append(item)


class _Sampler(threading.Thread):
    """Reads every limited counter every few milliseconds, from its own connection."""

    def __init__(self, url: str) -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self.conninfo = url.replace("postgresql+psycopg://", "postgresql://")
        self.stop = threading.Event()
        self.samples = 0
        self.violations: list[str] = []

    def run(self) -> None:
        conn: psycopg.Connection[tuple[object, ...]] | None = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=2)
                rows = conn.execute(
                    "SELECT scope, resource, in_use, reserved, hard_limit FROM quota_usages"
                    " WHERE hard_limit IS NOT NULL"
                ).fetchall()
            except psycopg.Error:
                conn = None  # killed, restarting: sample again once it is back
                self.stop.wait(0.05)
                continue
            self.samples += 1
            for scope, resource, in_use, reserved, limit in rows:
                if in_use < 0 or reserved < 0 or in_use + reserved > limit:  # type: ignore[operator]
                    self.violations.append(f"{scope}/{resource}: {in_use}+{reserved} > {limit}")
            self.stop.wait(0.01)
        if conn is not None:
            conn.close()


def run(
    cluster: PgCluster,
    phases: list[Phase],
    *,
    threads: int = 16,
    seed: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Run ``phases`` one after the other on a fresh database, then check everything."""
    say = progress or (lambda _text: None)
    rng = random.Random(seed)
    database = f"chaos_{uuid.uuid4().hex[:8]}"
    url = cluster.create_database(database)
    engine = QuotaEngine.from_url(url, pool_size=threads + 4)
    batched = QuotaEngine.from_url(url, pool_size=threads + 4, batching=True)
    began = time.monotonic()
    books, stats = Books(), Stats()
    faults: list[FaultRecord] = []
    terminated = [0]
    sampler = _Sampler(url)
    try:
        engine.migrate()
        for queue, limits in LIMITS.items():
            engine.set_limits(queue, limits)
        sampler.start()
        for phase in phases:
            kinds = ", ".join(f.kind for f in phase.faults) or "none"
            say(f"phase {phase.name}: {phase.mode}, {phase.seconds:g} s, faults: {kinds}")
            calls = batched if phase.mode == "batching" else engine
            _phase(cluster, database, url, calls, phase, threads, rng, books, stats, faults, terminated)
        sampler.stop.set()
        sampler.join(30)
        say("checking")
        invariants = check(books, read_tables(url))
        drift = [repr(d) for d in _retrying(engine.audit)]
    finally:
        sampler.stop.set()
        engine.close()
        batched.close()
    for record in faults:
        record.recovery = recovery(stats, record)
    return Report(
        phases=[f"{p.name} ({p.mode}, {p.seconds:g} s)" for p in phases],
        threads=threads,
        seconds=time.monotonic() - began,
        stats=stats,
        faults=faults,
        terminated=terminated[0],
        samples=sampler.samples,
        sample_violations=sampler.violations,
        invariants=invariants,
        drift=drift,
        batches=batched.batch_stats,
    )


def _phase(
    cluster: PgCluster,
    database: str,
    url: str,
    engine: QuotaEngine,
    phase: Phase,
    threads: int,
    rng: random.Random,
    books: Books,
    stats: Stats,
    faults: list[FaultRecord],
    terminated: list[int],
) -> None:
    service = None
    if phase.mode == "http":
        token = _retrying(lambda: tokens.add(engine, f"chaos-{phase.name}-{uuid.uuid4().hex[:6]}", "service"))
        service = Service(url, cluster.root / f"service-{phase.name}.log")
        service.start()
        base = service.base
        callers: list[Caller] = [HttpCaller(base, token) for _ in range(threads)]
    else:
        callers = [LibraryCaller(engine) for _ in range(threads)]
    stop, quiet = threading.Event(), threading.Event()
    workers = [
        Worker(f"{phase.name}-{i}", caller, books, stats, random.Random(rng.random()))
        for i, caller in enumerate(callers)
    ]
    crew = [threading.Thread(target=w.run, args=(stop,), name=w.name, daemon=True) for w in workers]
    started = time.monotonic()

    def terminator() -> None:
        assert phase.terminate is not None
        while not quiet.wait(rng.uniform(*phase.terminate)):
            with contextlib.suppress(psycopg.Error):  # the database is down for another fault
                terminated[0] += cluster.terminate_backends(database)

    broken: list[BaseException] = []

    def injector() -> None:
        try:
            inject()
        except BaseException as error:  # raised again once the phase has stopped
            broken.append(error)

    def inject() -> None:
        for fault in sorted(phase.faults, key=lambda f: f.at):
            if quiet.wait(max(0.0, started + fault.at - time.monotonic())):
                return
            at = time.monotonic()
            if fault.kind == "restart":
                cluster.restart_immediate()
            elif fault.kind == "kill_postmaster":
                cluster.start_after_kill(cluster.kill_postmaster())
            elif fault.kind == "kill_service":
                assert service is not None, "kill_service needs an http phase"
                service.kill()
                service.start()
            else:
                raise ValueError(f"unknown fault {fault.kind!r}")
            faults.append(FaultRecord(phase.name, fault.kind, at, time.monotonic(), at - started))

    helpers = [threading.Thread(target=injector, name="chaos-injector", daemon=True)]
    if phase.terminate is not None:
        helpers.append(threading.Thread(target=terminator, name="chaos-terminator", daemon=True))
    try:
        for thread in crew + helpers:
            thread.start()
        time.sleep(phase.seconds)
        helpers[0].join()  # every fault injected and repaired before the callers wind down
        if broken:
            raise RuntimeError(f"a fault could not be injected or repaired: {broken[0]!r}") from broken[0]
        stop.set()
        for thread in crew:
            thread.join(timeout=300)
            if thread.is_alive():
                raise RuntimeError(f"{thread.name} hangs")
    finally:
        stop.set()
        quiet.set()
        for thread in helpers:
            thread.join(timeout=60)
        for caller in callers:
            caller.close()
        if service is not None:
            service.stop()


def _retrying(call: Callable[[], T]) -> T:
    """For the harness's own setup and checks: the database may still be recovering."""
    for _ in range(60):
        try:
            return call()
        except DatabaseUnavailable:
            time.sleep(0.5)
    raise RuntimeError("the database did not come back")
