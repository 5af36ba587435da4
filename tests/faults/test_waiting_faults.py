"""Waiting requests under faults, on the tests' own PostgreSQL cluster: the process that frees
capacity is killed (``kill -9``) right after its commit, and the database restarts while requests
wait. Nothing granted is lost, nothing is granted twice, and nobody waits forever."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid

from pg_cluster import PgCluster

from quota_ledger import QuotaEngine, ReservationState

CONFIG = {
    "partitions": [
        {
            "name": "default",
            "queues": [{"name": "root", "queues": [{"name": "a", "resources": {"max": {"fpga": "4"}}}]}],
        }
    ]
}

#: frees the capacity (a rollback, committed), then dies at once by SIGKILL, before any pass of
#: its own over the line can run
_FREE_AND_DIE = textwrap.dedent(
    """
    import os, signal, sys
    from quota_ledger import QuotaEngine
    engine = QuotaEngine.from_url(os.environ["LEDGER_URL"])
    engine.granter.freed = lambda *a, **k: None  # its own pass would grant: it must not get to
    engine.rollback(sys.argv[1])
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _engine(cluster: PgCluster, **options: object) -> QuotaEngine:
    url = cluster.create_database(f"waiting_{uuid.uuid4().hex[:8]}")
    engine = QuotaEngine.from_url(url, **options)  # type: ignore[arg-type]
    engine.migrate()
    engine.apply_config(CONFIG)
    return engine


def test_a_waiter_is_granted_when_the_process_that_freed_capacity_is_killed(cluster: PgCluster) -> None:
    engine = _engine(cluster, wait_poll_interval=0.2)
    try:
        holder = engine.reserve("root.a", {"fpga": 4})
        waiting = engine.reserve("root.a", {"fpga": 3}, wait=60, block=False)
        assert waiting.state is ReservationState.WAITING
        url = engine.driver.engine.url.render_as_string(hide_password=False)
        killer = subprocess.Popen(
            [sys.executable, "-c", _FREE_AND_DIE, holder.id],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "LEDGER_URL": url},
        )
        assert killer.wait(timeout=60) == -9
        granted = engine.wait_for(waiting.id, 30)
        assert granted.state is ReservationState.PENDING
        assert engine.get(holder.id).state is ReservationState.ROLLED_BACK
        assert engine.usage("root.a")["fpga"].reserved == 3
        assert engine.audit() == []
    finally:
        engine.close()


def test_requests_wait_through_a_database_restart(cluster: PgCluster) -> None:
    engine = _engine(cluster, wait_poll_interval=0.2)
    engine.driver.backoff_base = 0.05
    try:
        holder = engine.reserve("root.a", {"fpga": 4})
        first = engine.reserve("root.a", {"fpga": 2}, wait=120, block=False)
        second = engine.reserve("root.a", {"fpga": 2}, wait=120, block=False, priority=1)
        results: dict[str, object] = {}

        def wait(name: str, rid: str) -> None:
            results[name] = engine.wait_for(rid, 90)

        waiters = [
            threading.Thread(target=wait, args=(n, r.id)) for n, r in (("first", first), ("second", second))
        ]
        for waiter in waiters:
            waiter.start()
        time.sleep(0.5)
        cluster.restart_immediate()
        cluster.wait_ready()
        engine.rollback(holder.id)
        for waiter in waiters:
            waiter.join(timeout=120)
        assert {n: r.state for n, r in results.items()} == {  # type: ignore[attr-defined]
            "first": ReservationState.PENDING,
            "second": ReservationState.PENDING,
        }
        assert engine.usage("root.a")["fpga"].reserved == 4
        assert engine.waiting() == []
        assert engine.audit() == []
    finally:
        engine.close()
