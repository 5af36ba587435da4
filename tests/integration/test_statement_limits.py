"""Statements that name one value per scope or resource stay within SQLite's limits whatever
their number: they go one slice at a time, and the rows still come in the canonical order.

SQLite is held to its stock limits here (32,766 parameters, 2,000 result columns, expressions
1,000 deep): distributions may build it with more, which would hide a statement too large for
another build. The other backends run the same checks.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.driver import counters, identity

#: SQLite's default SQLITE_MAX_VARIABLE_NUMBER (since 3.32)
SQLITE_PARAMETERS = 32_766


@pytest.fixture
def stock(db_url: URL) -> Iterator[QuotaEngine]:
    """An engine; on SQLite with the stock limit of parameters on every connection."""
    engine = QuotaEngine.from_url(db_url)
    if engine.driver.backend == "sqlite":

        def limited(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_PARAMETERS)

        event.listen(engine.driver.engine, "connect", limited)
        engine.driver.engine.dispose()
    yield engine
    engine.close()


def test_limits_are_locked_on_more_scopes_than_one_statement_may_name(stock: QuotaEngine) -> None:
    # the lineages of a batch of reservations on deep queues, each queue a path of its own
    scopes = [f"root.x{i:05d}" for i in range(2 * SQLITE_PARAMETERS)]
    assert len(scopes) > 10 * counters.SCOPE_SLICE
    limited = [scopes[0], scopes[counters.SCOPE_SLICE], scopes[-1]]
    for scope in reversed(limited):
        stock.set_limits(scope, {"fpga": 10, "memory": "1Gi"})
    found = stock.driver.run(lambda tx: tx.lock_subtree_counters("default", scopes, ["fpga", "memory"]))
    assert [(c.scope, c.resource) for c in found] == [(s, r) for s in limited for r in ("fpga", "memory")]
    unlocked = stock.driver.run(lambda tx: tx.lock_subtree_counters("default", scopes, ["fpga"], lock=False))
    assert [c.scope for c in unlocked] == limited


def test_more_resources_are_checked_for_names_than_one_statement_may_return(stock: QuotaEngine) -> None:
    stock.set_limits("root.a", {"fpga": 10})
    asked = [f"r{i:04d}" for i in range(2_100)] + ["fpga"]  # over SQLite's 2,000 result columns
    unnamed = stock.driver.run(lambda tx: tx.unnamed_resources("default", asked))
    assert unnamed == set(asked) - {"fpga"}


def test_user_and_group_counters_are_locked_by_more_keys_than_one_statement_may_name(
    stock: QuotaEngine,
) -> None:
    stock.apply_config(
        """
partitions:
- name: default
  queues:
  - name: root
    limits:
    - users: ["*"]
      maxresources: {fpga: 10}
    queues:
    - name: a
      limits:
      - users: [ann]
        maxresources: {fpga: 5}
"""
    )
    made = stock.reserve("root.a", {"fpga": 1}, user="ann")
    keys = [("user", f"u{i:05d}", "root.a", "fpga") for i in range(SQLITE_PARAMETERS)]
    keys += [("user", "ann", "root", "fpga"), ("user", "ann", "root.a", "fpga")]
    assert len(keys) > 10 * max(identity.KEY_SLICE.values())
    found = stock.driver.run(lambda tx: tx.lock_identity_keys("default", keys))
    assert [(c.name, c.scope, c.resource, c.reserved) for c in found] == [
        ("ann", "root", "fpga", 1),
        ("ann", "root.a", "fpga", 1),
    ]
    stock.rollback(made.id)
