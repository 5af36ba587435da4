"""The ledger on Galera in single-writer mode, under load, when the writer is killed.

Every client is given the same node list, so all of them write on node 1 until it dies, then
on the next node that answers. In order, on one cluster: admin writes on the writer while
clients reserve in the queues they change; ``kill -9`` of the writer mid-load; the killed node
rejoining (IST); then clients spread over the nodes (multi-writer), measured and checked.
Throughout, a sampler reads every live node's counters every 100 ms and no counter may be over
its limit; no operation the ledger acknowledged may be missing afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ledger_checks
import ledger_load
import pytest
from galera import GaleraCluster, GaleraNode
from ledger_load import Load, LoadResult, Shape

from quota_ledger import QuotaEngine, QuotaLedgerError

pytestmark = pytest.mark.cluster

DATABASE = "failover"
SHAPE = Shape(threads=6)
#: what callers may see while the writer is replaced (besides OverQuota refusals)
TYPED_DURING_FAILOVER = {"DatabaseUnavailable"}


def _attempts(engine: QuotaEngine, call: Callable[[], object]) -> int:
    """Run ``call``, which must end within the retry budget's time; the attempts the driver
    made (1 + the retries it counted)."""
    before = sum(engine.driver.retries.values())
    started = time.monotonic()
    call()
    assert time.monotonic() - started < ledger_load.RETRY_SECONDS
    return 1 + sum(engine.driver.retries.values()) - before


def _raised(config: dict[str, Any], queue: str, limit: int) -> dict[str, Any]:
    """``config`` with ``queue``'s fpga limit set to ``limit``."""
    level = config["partitions"][0]["queues"]
    for name in queue.split("."):
        found = next(q for q in level if q["name"] == name)
        level = found.setdefault("queues", [])
    found["resources"]["max"]["fpga"] = str(limit)
    return config


def _admin_writes_succeed_under_load(urls: list[str]) -> None:
    hot = SHAPE.hot()[0]
    with ledger_load.connect(urls) as admin:
        attempts = {
            "set_limits": _attempts(admin, lambda: admin.set_limits(hot, {"fpga": SHAPE.hot_limit + 1})),
            "apply_config": _attempts(
                admin, lambda: admin.apply_config(_raised(admin.config(), hot, SHAPE.hot_limit + 2))
            ),
        }
        drifts: list[object] = []
        attempts["audit_fix"] = _attempts(admin, lambda: drifts.extend(admin.audit(fix=True)))
        print(f"admin writes under load, attempts: {attempts}")
        assert all(n <= ledger_load.RETRY_ATTEMPTS for n in attempts.values()), attempts
        assert drifts == []
        assert admin.limits()[hot] == {"fpga": SHAPE.hot_limit + 2}


def _writer_killed(galera: GaleraCluster, engine: QuotaEngine) -> float:
    """``kill -9`` node 1 under load; seconds until a reserve + commit succeeds again."""
    assert ledger_checks.writers(galera.nodes, DATABASE) == ["node1"]  # the clients write there
    galera.nodes[0].kill()
    killed = time.monotonic()
    while True:
        try:
            engine.commit(engine.reserve(SHAPE.cold()[0], {"fpga": 1}).id)
            return time.monotonic() - killed
        except QuotaLedgerError:  # anything else fails the test at once
            assert time.monotonic() - killed < 30, "no successful write within 30 s of the kill"


def _check(name: str, result: LoadResult, sampler: ledger_checks.Sampler, nodes: list[GaleraNode]) -> None:
    print(f"{name}: {result.summary()}")
    print(sampler.summary())
    assert result.unexpected == []
    assert sampler.violations == 0, sampler.examples[:10]
    assert all(sampler.samples[n.name] > 0 for n in nodes), sampler.summary()
    assert result.pairs > 20  # a handful a second on a starved machine, hundreds on an idle one
    settled = ledger_checks.wait_identical(nodes, DATABASE)
    assert all(s == settled[0] for s in settled)
    for node in nodes:
        assert ledger_checks.lost_acks(node, DATABASE, result.acks) == []


def test_the_writer_is_killed_under_load_and_nothing_acknowledged_is_lost(galera: GaleraCluster) -> None:
    """One test, in steps that build on each other on one cluster (it takes ~30 s to start)."""
    urls = galera.create_database(DATABASE)
    node1, node2, node3 = galera.nodes
    with ledger_load.connect(urls) as engine:
        engine.migrate()
        ledger_load.prepare(engine, SHAPE)
    ledger_checks.wait_identical(galera.nodes, DATABASE)
    galera.wait_synced()

    engine = ledger_load.connect(urls)
    sampler = ledger_checks.Sampler(galera.nodes, DATABASE).start()
    load = Load([engine], SHAPE, name="single").start()
    try:
        time.sleep(2)
        _admin_writes_succeed_under_load(urls)
        time.sleep(1)
        recovery = _writer_killed(galera, engine)
        print(f"a reserve + commit succeeded {recovery:.2f} s after the writer was killed")
        assert recovery < 10
        time.sleep(2)
    finally:
        result = load.stop()
        sampler.stop()
    assert set(result.errors) <= TYPED_DURING_FAILOVER, result.errors
    assert result.refused > 0  # the hot queues' limits were reached
    _check("one writer, killed", result, sampler, [node2, node3])

    node1.start()
    galera.wait_size(3, on=node1)
    log = node1.log_tail(100_000)
    assert "IST received" in log, log[-3000:]  # the writes it missed, from a survivor's cache
    sums = ledger_checks.wait_identical(galera.nodes, DATABASE)
    assert sums[0] == sums[1] == sums[2]
    for url in urls:
        with QuotaEngine.from_url(url) as one:
            assert one.audit() == []

    # Multi-writer: each client writes on its own node; correct, at the price of conflicts.
    galera.wait_synced()
    engines = [ledger_load.connect(urls[i:] + urls[:i]) for i in range(3)]
    sampler = ledger_checks.Sampler(galera.nodes, DATABASE).start()
    load = Load(engines, SHAPE, name="multi").start()
    try:
        time.sleep(3)
    finally:
        result = load.stop()
        sampler.stop()
        for each in [*engines, engine]:
            each.close()
    _check("clients over 3 nodes", result, sampler, galera.nodes)
    for url in urls:
        with QuotaEngine.from_url(url) as one:
            assert one.audit() == []
