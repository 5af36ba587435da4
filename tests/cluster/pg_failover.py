"""The PostgreSQL primary killed under load and its standby promoted, measured.

:func:`failover` migrates a fresh database on a :class:`PgReplication` pair, starts the load of
:mod:`ledger_load` (:func:`shape`) on an engine given both hosts (the primary first) and an over-limit sampler
on each server, lets it run, kills the primary with ``kill -9``, promotes the standby (after
``promote_delay`` seconds: how long an operator or a failover manager takes to decide), waits
until an operation started after the kill is answered, lets the load run on, and then checks the
promoted server against the callers' log. :func:`standalone` runs the same load on a single
server started the same way, for the throughput the replication costs. Figures come back as a
:class:`Figures`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ledger_load
import pg_checks
import psycopg
from ledger_load import Load, LoadResult, Shape
from pg_checks import OverLimitSampler
from pg_cluster import PgCluster
from pg_replication import STANDBY_NAME, PgReplication

from quota_ledger import Drift, QuotaEngine

#: seconds of load before the measured window starts (connections, caches)
WARMUP = 1.0


def shape(threads: int) -> Shape:
    """The load of a failover: one hot queue and as many cold ones as clients under a parent
    with a limit of its own, so that each of them refuses now and then; 1 to 3 ``fpga`` a
    reservation; a call the driver gave up on is made again until it is answered."""
    return Shape(
        threads=threads,
        hot_queues=1,
        cold_queues=threads,
        hot_limit=5 * threads,
        cold_limit=12,
        cold_parent_limit=6 * threads,
        most=3,
        rollback_share=0.2,
        again=None,
        pause=0.05,
    )


def writer_engine(primary: str, standby: str, attrs: str = "read-write", **options: Any) -> QuotaEngine:
    """An engine given both hosts, the primary first (both ``postgresql+psycopg://user@host:port/db``).

    With ``attrs`` ``read-write`` that is the list, as an application passes it; else one libpq
    multi-host URL with that ``target_session_attrs`` (``any``: the first host that answers)."""
    if attrs == "read-write":
        return QuotaEngine.from_url([primary, standby], **options)
    head, _, rest = primary.partition("@")
    database = rest.split("/", 1)[1]
    hosts = "&".join(f"host={url.partition('@')[2].split('/', 1)[0]}" for url in (primary, standby))
    return QuotaEngine.from_url(f"{head}@/{database}?{hosts}&target_session_attrs={attrs}", **options)


@dataclass
class Window:
    """Operations answered in a stretch of time: how many per second, and how fast."""

    seconds: float
    answered: int
    p50_ms: float
    p99_ms: float

    @property
    def rate(self) -> float:
        return self.answered / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        return f"{self.rate:.0f} ops/s, p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms"


def window(result: LoadResult, start: float, end: float) -> Window:
    taken = sorted(answered - sent for sent, answered in result.spans if start <= answered < end)
    if not taken:
        return Window(seconds=end - start, answered=0, p50_ms=0.0, p99_ms=0.0)
    p99 = taken[min(len(taken) - 1, int(len(taken) * 0.99))]
    return Window(
        seconds=end - start, answered=len(taken), p50_ms=statistics.median(taken) * 1000, p99_ms=p99 * 1000
    )


@dataclass
class Figures:
    """What one failover (or one standalone run) measured."""

    mode: str
    threads: int
    result: LoadResult
    before: Window
    after: Window | None = None
    #: seconds from the kill to the first answer of an operation started after it
    recovery: float | None = None
    #: seconds from the kill to the end of ``pg_ctl promote``
    promoted: float | None = None
    #: seconds from the kill until the killed primary's last backend was gone
    orphaned: float | None = None
    #: per server: (samples, samples that failed, samples that found a counter over its limit)
    samples: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: acknowledgements the promoted server does not hold, or that a later answer contradicted
    lost: list[str] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return sum(v for _, _, v in self.samples.values())

    def lines(self) -> list[str]:
        t = self.result
        made = [
            f"{self.mode}, {self.threads} threads: {sum(t.done.values())} operations answered {dict(t.done)}",
            f"  {'load' if self.mode == 'standalone' else 'before the kill'}: {self.before.describe()}",
        ]
        if self.after is not None:
            made.append(f"  after recovery: {self.after.describe()}")
        if self.recovery is not None or self.promoted is not None:
            rec = "never" if self.recovery is None else f"{self.recovery:.2f} s"
            made.append(
                f"  the killed primary's backends gone {self.orphaned:.2f} s after the kill, standby promoted"
                f" {self.promoted:.2f} s after it; serving again {rec} after it"
            )
        for node, (n, failed, bad) in self.samples.items():
            made.append(f"  sampler {node}: {n} samples, {failed} failed, {bad} over a limit")
        if self.after is not None:
            made.append(f"  acknowledged reservations {len(t.acks)}, lost {len(self.lost)}")
            made += [f"    {line}" for line in self.lost[:10]]
            made.append(f"  audit on the promoted server: {len(self.drift)} drifts")
        made.append(
            f"  refused {t.refused}; errors by type: {dict(t.errors) or 'none'}; untyped {len(t.unexpected)}"
        )
        return made


def _ledger(url: str, threads: int) -> None:
    with QuotaEngine.from_url(url) as engine:
        engine.migrate()
        ledger_load.prepare(engine, shape(threads))


def failover(
    pair: PgReplication,
    *,
    threads: int,
    before: float,
    after: float,
    promote_delay: float = 0.0,
    attrs: str = "read-write",
    whole: bool = True,
    lag: float = 0.0,
    database: str = "failover",
    recovery_timeout: float = 30,
) -> Figures:
    """Kill the pair's primary under load after ``before`` seconds, promote the standby, and run
    ``after`` seconds more once it serves; the pair is left with its standby promoted.

    ``whole``: every process of the primary is killed at once, as when its host dies; else only
    its postmaster, whose backends and WAL sender live on until they notice (a WAL sender may
    still send the standby what it had not yet sent). ``lag``: the primary's WAL sender is stopped
    (``SIGSTOP``) that many seconds before the kill, as a slow link or a stalled standby would
    hold it back: a synchronous primary acknowledges no commit meanwhile, an asynchronous one
    goes on, and what it acknowledged in that time is what the promoted standby lacks."""
    primary_url, standby_url = pair.create_database(database)
    _ledger(primary_url, threads)
    pair.wait_replayed()
    samplers = {"primary": OverLimitSampler(primary_url), "standby": OverLimitSampler(standby_url)}
    engine = writer_engine(primary_url, standby_url, attrs)
    load = Load([engine], shape(threads))
    try:
        for sampler in samplers.values():
            sampler.start()
        started = time.monotonic()
        load.start()
        time.sleep(max(0.0, before - lag))
        if lag > 0:
            os.kill(_wal_sender(pair), signal.SIGSTOP)
            time.sleep(lag)
        killed = time.monotonic()
        orphans = kill_server(pair.primary) if whole else pair.kill_primary()
        gone = _wait_gone(orphans, killed + recovery_timeout)
        time.sleep(max(0.0, killed + promote_delay - time.monotonic()))
        pair.promote()
        promoted = time.monotonic()
        deadline = promoted + recovery_timeout
        while load.latest_sent < gone and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(after)
    finally:
        result = load.stop()
        stopped = time.monotonic()
        for sampler in samplers.values():
            sampler.stop()
    try:
        drift = engine.audit()
    finally:
        engine.close()
    # The killed primary's backends (its walsender too) live on until they notice: an operation
    # sent before they are gone may still be answered by the dead primary.
    waited = result.first_answer_after(gone)
    recovered = None if waited is None else gone + waited
    mode = ("sync" if pair.synchronous else "async") + ("" if whole else ", postmaster killed")
    mode += f", WAL sender stopped {lag:g} s before the kill" if lag else ""
    return Figures(
        mode=mode if attrs == "read-write" else f"{mode}, target_session_attrs={attrs}",
        threads=threads,
        result=result,
        before=window(result, started + WARMUP, killed),
        after=None if recovered is None else window(result, recovered, stopped),
        recovery=None if recovered is None else recovered - killed,
        promoted=promoted - killed,
        orphaned=gone - killed,
        samples={name: (s.samples, s.failed, s.violations) for name, s in samplers.items()},
        lost=pg_checks.lost_acks(standby_url, result.acks),
        drift=drift,
    )


def _wal_sender(pair: PgReplication) -> int:
    with psycopg.connect(pair.primary.url, autocommit=True, connect_timeout=3) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_replication WHERE application_name = %s", (STANDBY_NAME,)
        ).fetchone()
    if row is None:
        raise AssertionError("the primary has no WAL sender for the standby")
    return int(row[0])


def kill_server(cluster: PgCluster) -> list[int]:
    """``kill -9`` of a server's postmaster and of every process it started, at once; their pids.

    The postmaster is stopped first, so that it starts no process while its children die."""
    postmaster = cluster.postmaster_pid()
    os.kill(postmaster, signal.SIGSTOP)
    children = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _parent(entry) == postmaster
    ]
    for pid in [*children, postmaster]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [postmaster, *children]


def _parent(process: Path) -> int | None:
    try:
        status = (process / "status").read_text()
    except OSError:
        return None
    found = next((line for line in status.splitlines() if line.startswith("PPid:")), None)
    return None if found is None else int(found.split()[1])


def _wait_gone(pids: list[int], deadline: float) -> float:
    """When the last of ``pids`` exited (or became a zombie), or ``deadline``."""
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(pid)
        if not alive:
            break
        pids = alive
        time.sleep(0.01)
    return time.monotonic()


def standalone(*, threads: int, seconds: float, root: Path | None = None) -> Figures:
    """The same load on one PostgreSQL server with the same settings and no standby."""
    base = Path(tempfile.mkdtemp(prefix="ql-pg-standalone-")) if root is None else root
    base.chmod(0o755)
    server = PgCluster(base, settings={"cluster_name": "standalone"})
    try:
        server.start()
        url = server.create_database("standalone")
        _ledger(url, threads)
        sampler = OverLimitSampler(url)
        sampler.start()
        with QuotaEngine.from_url(url) as engine:
            load = Load([engine], shape(threads))
            started = time.monotonic()
            load.start()
            time.sleep(seconds + WARMUP)
            ended = time.monotonic()
            result = load.stop()
        sampler.stop()
    finally:
        server.destroy()
        shutil.rmtree(base, ignore_errors=True)
    return Figures(
        mode="standalone",
        threads=threads,
        result=result,
        before=window(result, started + WARMUP, ended),
        samples={"server": (sampler.samples, sampler.failed, sampler.violations)},
    )


def table(alone: list[Figures], failed_over: Figures) -> str:
    """The figures of :func:`standalone` runs and of :func:`failover` as a Markdown table; the
    ratios are to the mean rate of the standalone runs (before and after, on a shared machine)."""
    rows = [(f"standalone server, run {n}", figures.before) for n, figures in enumerate(alone, 1)]
    rows.append((f"primary + standby ({failed_over.mode}), before the kill", failed_over.before))
    if failed_over.after is not None:
        rows.append(("promoted standby, after recovery", failed_over.after))
    base = statistics.mean(figures.before.rate for figures in alone) or 1.0
    made = ["| load on | ops/s | vs standalone | p50 ms | p99 ms |", "|---|---:|---:|---:|---:|"]
    for name, w in rows:
        made.append(f"| {name} | {w.rate:.0f} | {w.rate / base:.2f} | {w.p50_ms:.1f} | {w.p99_ms:.1f} |")
    recovery = "never" if failed_over.recovery is None else f"{failed_over.recovery:.2f} s"
    made += [
        "",
        f"- recovery (kill -9 to the first answer of an operation sent after it): {recovery}"
        f" (promoted {failed_over.promoted or 0:.2f} s after the kill)",
        f"- over-limit samples: {failed_over.violations + sum(f.violations for f in alone)}"
        f" of {sum(n for n, _, _ in failed_over.samples.values())}",
        f"- acknowledged reservations: {len(failed_over.result.acks)}, lost: {len(failed_over.lost)}",
        f"- refused: {failed_over.result.refused}, errors by type: {dict(failed_over.result.errors)},"
        f" untyped: {len(failed_over.result.unexpected)}",
        f"- audit on the promoted server: {len(failed_over.drift)} drifts",
    ]
    return "\n".join(made)
