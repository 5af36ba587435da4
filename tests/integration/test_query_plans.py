"""The hot statements can use their indexes (PostgreSQL EXPLAIN), so they stay fast at scale.

On PostgreSQL the general path runs the named SQL of ``pg_fast``, so that is what is explained
here; the statements inside the server-side functions are explained with ``auto_explain``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from psycopg import ClientCursor
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.driver.dialect import ADVISORY_NAMESPACE, advisory_key, normalize_url
from quota_ledger.driver.pg_fast import SQL


@pytest.fixture
def pg(postgres_url: URL) -> Iterator[tuple[QuotaEngine, Connection]]:
    url = postgres_url
    ledger = QuotaEngine.from_url(url)
    for i in range(50):
        ledger.set_limits(f"root.q{i}", {"fpga": 100})
        ledger.reserve(f"root.q{i}.x", {"fpga": 1, "memory": "1Gi"}, ttl=600)
    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.execute(text("SET enable_seqscan = off"))
        yield ledger, conn
    engine.dispose()
    ledger.close()


def plan(conn: Connection, name: str, params: dict[str, Any]) -> str:
    """EXPLAIN of the named statement as the driver runs it, parameters bound client-side."""
    cursor = ClientCursor(conn.connection.driver_connection)  # type: ignore[arg-type]
    cursor.execute("EXPLAIN " + SQL[name], params)
    return "\n".join(row[0] for row in cursor.fetchall())


# Few rows are expired at :now, as in production; with a volatile clock call in the predicate
# instead of a bound value, PostgreSQL could not use the index at all.
def test_sweep_query_uses_the_pending_expiry_index(pg: tuple[QuotaEngine, Connection]) -> None:
    _, conn = pg
    text_plan = plan(conn, "lock_expired", {"p": "default", "n": 500, "now": datetime(2000, 1, 1)})
    assert "ix_reservations_partition_state_expires_at" in text_plan


def test_counter_locks_use_the_unique_counter_index(pg: tuple[QuotaEngine, Connection]) -> None:
    _, conn = pg
    params = {"p": "default", "scopes": ["root", "root.q1", "root.q1.x"], "resources": ["fpga", "memory"]}
    for name in ("lock_queue_counters", "lock_subtree_counters"):
        assert "uq_quota_usages_partition_scope_type_scope_resource" in plan(conn, name, params)


def test_reservation_lookup_by_key_uses_the_key_index(pg: tuple[QuotaEngine, Connection]) -> None:
    _, conn = pg
    text_plan = plan(conn, "find_reservation_by_key", {"p": "default", "key": "k"})
    assert "uq_reservations_partition_key" in text_plan


def test_the_expiry_function_finds_its_batch_by_the_pending_expiry_index(
    pg: tuple[QuotaEngine, Connection],
) -> None:
    _, conn = pg
    version = conn.execute(text("SELECT version FROM quota_config_head")).scalar_one()
    raw = conn.connection.driver_connection
    plans: list[str] = []
    raw.add_notice_handler(lambda diagnostic: plans.append(diagnostic.message_primary or ""))  # type: ignore[union-attr]
    conn.execute(text("LOAD 'auto_explain'"))
    for setting in ("log_min_duration = 0", "log_nested_statements = on"):
        conn.execute(text(f"SET auto_explain.{setting}"))
    conn.execute(text("SET client_min_messages = log"))
    expired = conn.execute(
        text("SELECT quota_ledger_expire('default', 10, '{}'::text[], :v, :ns, :k)"),
        {"v": version, "ns": ADVISORY_NAMESPACE, "k": advisory_key("default")},
    ).scalar_one()
    assert expired == 0  # nothing has expired: the batch query ran and found nothing
    batch = [p for p in plans if "FOR UPDATE SKIP LOCKED" in p]
    assert batch, plans
    assert "ix_reservations_partition_state_expires_at" in batch[0]
