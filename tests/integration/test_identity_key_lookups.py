"""User/group counters locked by whole key are looked up one key at a time (MariaDB, SQLite):
the plan of the statement ``lock_identity_keys`` sends reads the unique index with every column
of the key, never every counter of the partition."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.driver import identity

KEYS = [
    ("user", "ann", "root.org", "fpga"),
    ("group", "dev", "root.org.team", "memory"),
    ("user", "bob", "root", "fpga"),
]


def test_counters_locked_by_key_are_looked_up_by_the_whole_key(core_db_url: URL) -> None:
    sent: list[tuple[str, Any]] = []
    with QuotaEngine.from_url(core_db_url) as ledger:

        def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
            if "quota_identity_usages" in statement:
                sent.append((statement, parameters))

        event.listen(ledger.driver.engine, "before_cursor_execute", seen)
        assert ledger.driver.run(lambda tx: tx.lock_identity_keys("default", KEYS)) == []
        event.remove(ledger.driver.engine, "before_cursor_execute", seen)
        ((statement, parameters),) = sent
        with ledger.driver.engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                plan = [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)]
                searches = [step for step in plan if "quota_identity_usages" in step]
                assert len(searches) == len(KEYS), plan
                whole = "(partition=? AND kind=? AND name=? AND queue=? AND resource=?)"
                assert all(step.startswith("SEARCH") and whole in step for step in searches), plan
            else:
                (row,) = conn.exec_driver_sql(f"EXPLAIN {statement}", parameters).mappings().all()
                assert row["type"] == "range", row
                assert row["key"] == identity._IDENTITY_INDEX, row
                assert int(row["key_len"]) > 4 * 4 * 64, row  # every column of the key, not the partition's
