"""One engine on a list of writer URLs keeps serving while its writer dies: on a three-node Galera
cluster the writer node is killed with ``kill -9`` mid-traffic and the next node takes over; on a
PostgreSQL primary with a synchronous hot standby the primary is killed and the standby promoted,
and libpq's multi-host connection finds it. No call fails, no caller hangs, and the counters
agree with the ledger afterwards.

One test per cluster, in steps that build on each other (the clusters take long to start)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from galera import GaleraCluster
from pg_replication import PgReplication
from polling import eventually
from sqlalchemy import text

from quota_ledger import QuotaEngine
from quota_ledger.driver import topology
from quota_ledger.driver.tx import LedgerTx

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def replication() -> Iterator[PgReplication]:
    """A primary and a synchronous standby: a commit the engine saw survives the failover."""
    made = PgReplication(synchronous=True)
    try:
        made.start()
        yield made
    finally:
        made.destroy()


def _scalar(sql: str) -> Callable[[LedgerTx], Any]:
    return lambda tx: tx.conn.execute(text(sql)).scalar()


class Traffic:
    """Four callers reserving (with a key) and committing until stopped; when each call ended."""

    def __init__(self, engine: QuotaEngine, queue: str) -> None:
        self.engine = engine
        self.queue = queue
        self.done: list[float] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,)) for i in range(4)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in self._threads), "a caller hangs"

    def served_since(self, moment: float) -> int:
        return sum(1 for at in self.done if at > moment)

    def longest_pause_since(self, moment: float) -> float:
        """The longest time after ``moment`` in which no call ended."""
        times = [moment, *sorted(at for at in self.done if at > moment)]
        return max(later - earlier for earlier, later in itertools.pairwise(times))

    def wait(self, condition: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition() and not self.errors:
            assert time.monotonic() < deadline, f"timed out; {len(self.done)} calls served"
            time.sleep(0.05)
        assert self.errors == []

    def _client(self, name: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                made = self.engine.reserve(self.queue, {"fpga": 1}, key=f"{name}-{n}")
                self.engine.commit(made.id)
            except BaseException as error:  # the test reports every failure
                self.errors.append(error)
                return
            self.done.append(time.monotonic())


def test_galera_the_next_node_takes_over_when_the_writer_is_killed(galera: GaleraCluster) -> None:
    urls = galera.create_database("failover")
    engine = QuotaEngine.from_url(urls, read_urls=[urls[2]], pool_size=4)
    engine.migrate()
    nodes = topology.nodes(engine.driver.engine)
    assert nodes is not None
    assert nodes.current == 0

    # The writer's sessions wait for the cluster before reading; the replica's do not.
    assert engine.driver.run(_scalar("SELECT @@wsrep_node_name")) == "node1"
    assert engine.driver.run(_scalar("SELECT @@session.wsrep_sync_wait")) == topology.GALERA_SYNC_WAIT
    assert engine.driver.run(_scalar("SELECT @@wsrep_node_name"), read_only=True) == "node3"
    assert engine.driver.run(_scalar("SELECT @@session.wsrep_sync_wait"), read_only=True) == 0

    # A node that is not synced is passed over by a new engine.
    galera.nodes[0].query("SET GLOBAL wsrep_desync = ON")
    try:
        with QuotaEngine.from_url(urls) as other:
            assert other.driver.run(_scalar("SELECT @@wsrep_node_name")) == "node2"
    finally:
        galera.nodes[0].query("SET GLOBAL wsrep_desync = OFF")

    engine.set_limits("root.a", {"fpga": 1_000_000})
    with Traffic(engine, "root.a") as traffic:
        traffic.wait(lambda: len(traffic.done) >= 40, 30)
        cut = time.monotonic()
        galera.nodes[0].kill()
        traffic.wait(lambda: traffic.served_since(cut) >= 40, 60)
    pause = traffic.longest_pause_since(cut)
    print(f"no call ended for {pause:.2f} s at most after the writer was killed")
    # Galera evicts a killed node after evs.inactive_timeout (4 s in the test cluster).
    assert pause < 10
    assert nodes.current == 1
    assert engine.driver.run(_scalar("SELECT @@wsrep_node_name")) == "node2"
    # The engine reads usage on its replica (node3), which may not have applied the last commits
    # yet; the writer's own sessions wait for the cluster.
    with QuotaEngine.from_url(urls) as writer:
        expected = writer.usage("root.a")
    assert expected["fpga"].in_use == len(traffic.done)
    assert engine.audit() == []
    with QuotaEngine.from_url(urls[2]) as reader:
        assert eventually(lambda: reader.usage("root.a"), expected) == expected
    engine.close()


def test_postgresql_the_promoted_standby_takes_over_when_the_primary_is_killed(
    replication: PgReplication,
) -> None:
    primary, standby = replication.create_database("failover")
    engine = QuotaEngine.from_url([primary, standby], read_urls=[standby], pool_size=4)
    engine.migrate()
    replication.wait_replayed()
    assert engine.driver.run(_scalar("SELECT pg_is_in_recovery()")) is False
    assert engine.driver.run(_scalar("SELECT pg_is_in_recovery()"), read_only=True) is True

    engine.set_limits("root.a", {"fpga": 1_000_000})
    with Traffic(engine, "root.a") as traffic:
        traffic.wait(lambda: len(traffic.done) >= 40, 30)
        cut = time.monotonic()
        # The primary's host is gone: the postmaster and every backend.
        for pid in replication.kill_primary():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        replication.promote()
        promoted = time.monotonic()
        traffic.wait(lambda: traffic.served_since(promoted) >= 40, 60)
    pause = traffic.longest_pause_since(cut)
    print(f"no call ended for {pause:.2f} s at most after the kill ({promoted - cut:.2f} s to promote)")
    assert pause < (promoted - cut) + 5
    assert replication.standby is not None
    assert engine.driver.run(_scalar("SELECT inet_server_port()")) == replication.standby.port
    assert engine.usage("root.a")["fpga"].in_use == len(traffic.done)
    assert engine.audit() == []
    engine.close()
