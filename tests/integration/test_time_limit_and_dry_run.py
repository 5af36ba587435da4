"""A call's time limit (``run(timeout=)``) and a decision that writes nothing (``rollback=``,
``admit_pod(dry_run=True)``), on every backend."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import func, select, text

from quota_ledger import DatabaseUnavailable, OverQuota, QuotaEngine
from quota_ledger.driver.schema import metadata
from quota_ledger.driver.tx import LedgerTx


def a_pod(uid: str, cpu: str = "1") -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": "1Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{uid}", "namespace": "team", "uid": uid},
        "spec": {"containers": [{"name": "a", "resources": {"requests": requests, "limits": requests}}]},
    }


def rows(engine: QuotaEngine) -> dict[str, int]:
    def work(tx: LedgerTx) -> dict[str, int]:
        return {
            t.name: tx.conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in metadata.sorted_tables
        }

    return engine.driver.run(work)


def test_a_dry_run_admission_decides_as_a_real_one_and_writes_nothing(ledger: QuotaEngine) -> None:
    ledger.set_limits("root.team", {"vcore": "2"})
    before = rows(ledger)
    tried = ledger.admit_pod(a_pod("u-1"), user="alice", dry_run=True)
    assert (tried.state, tried.user, tried.key) == ("pending", "alice", "u-1")
    with pytest.raises(OverQuota):
        ledger.admit_pod(a_pod("u-2", cpu="3"), user="alice", dry_run=True)
    assert rows(ledger) == before
    made = ledger.admit_pod(a_pod("u-1"), user="alice")
    assert ledger.admit_pod(a_pod("u-1"), user="alice").id == made.id  # decided once per pod uid
    assert rows(ledger) != before


def test_a_held_lock_gives_up_within_the_time_limit(server_ledger: QuotaEngine) -> None:
    server_ledger.admit_pod(a_pod("u-1"), user="alice")  # the partition exists
    driver = server_ledger.driver
    with driver.engine.connect() as conn, conn.begin():
        LedgerTx(conn, driver.backend, 0).lock_partition("default", exclusive=True)
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable):
            server_ledger.admit_pod(a_pod("u-2"), user="alice", timeout=1.0)
        took = time.monotonic() - started
    assert 0.9 < took < 1.5
    assert server_ledger.admit_pod(a_pod("u-2"), user="alice", timeout=1.0).state == "pending"


def test_mariadb_sessions_get_their_lock_wait_back_after_a_time_limit(mariadb_url: Any) -> None:
    with QuotaEngine.from_url(mariadb_url, pool_size=1) as engine:
        engine.driver.run(lambda tx: None, timeout=0.5)

        def settings(tx: LedgerTx) -> tuple[Any, ...]:
            found = tx.conn.execute(text("SELECT @@innodb_lock_wait_timeout, @@max_statement_time")).one()
            return (int(found[0]), float(found[1]))

        assert engine.driver.run(settings) == (20, 0.0)
