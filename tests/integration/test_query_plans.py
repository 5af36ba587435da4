"""The hot statements can use their indexes (PostgreSQL EXPLAIN), so they stay fast at scale.

On PostgreSQL the general path runs the ``PG_*`` statements on the psycopg cursor (see
``pg_cursor``), so those are what is explained here. A statement inside a server-side function is
taken from the function as the database holds it (``pg_get_functiondef``), its PL/pgSQL
variables become parameters, and it is explained both as the first calls plan it (custom plan)
and as later calls may (generic plan). This needs nothing
beyond core PostgreSQL: ``auto_explain`` is not in every build (the embedded server has none).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from psycopg import ClientCursor
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.driver import counters, reservations
from quota_ledger.driver.dialect import ADVISORY_NAMESPACE, advisory_key, normalize_url


@pytest.fixture
def pg(postgres_url: URL) -> Iterator[tuple[QuotaEngine, Connection]]:
    url = postgres_url
    ledger = QuotaEngine.from_url(url)
    for i in range(50):
        ledger.set_limits(f"root.q{i}", {"fpga": 100})
        for _ in range(2):  # several per queue, as in production
            ledger.reserve(f"root.q{i}.x", {"fpga": 1, "memory": "1Gi"}, ttl=600)
    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.execute(text("SET enable_seqscan = off"))
        yield ledger, conn
    engine.dispose()
    ledger.close()


def plan(conn: Connection, sql: str, params: dict[str, Any]) -> str:
    """EXPLAIN of the statement as the driver runs it, parameters bound client-side."""
    cursor = ClientCursor(conn.connection.driver_connection)  # type: ignore[arg-type]
    cursor.execute("EXPLAIN " + sql, params)
    return "\n".join(row[0] for row in cursor.fetchall())


# Few rows are expired at :now, as in production; with a volatile clock call in the predicate
# instead of a bound value, PostgreSQL could not use the index at all.
def test_sweep_query_uses_the_pending_expiry_index(pg: tuple[QuotaEngine, Connection]) -> None:
    _, conn = pg
    text_plan = plan(
        conn, reservations.PG_LOCK_EXPIRED, {"p": "default", "n": 500, "now": datetime(2000, 1, 1)}
    )
    assert "ix_reservations_partition_state_expires_at" in text_plan


def test_counter_locks_use_the_unique_counter_index(pg: tuple[QuotaEngine, Connection]) -> None:
    _, conn = pg
    params = {"p": "default", "scopes": ["root", "root.q1", "root.q1.x"], "resources": ["fpga", "memory"]}
    for sql in (counters.PG_LOCK_QUEUE, counters.PG_LOCK_SUBTREE):
        assert "uq_quota_usages_partition_scope_type_scope_resource" in plan(conn, sql, params)


def test_the_limits_of_one_queue_are_locked_through_an_index_range_on_the_queue(
    pg: tuple[QuotaEngine, Connection],
) -> None:
    """set_limits locks one queue's limits: the queue is part of the index condition, whatever the
    statistics (a list of scopes may be planned as a filter over every limit of the partition)."""
    _, conn = pg
    stmt = counters._LOCK_LIMITS_AT.params(p="default", q="root.q1", resources=["fpga", "memory"])
    sql = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    text_plan = "\n".join(row[0] for row in conn.execute(text("EXPLAIN " + sql)))
    condition = next(line for line in text_plan.splitlines() if "Index Cond" in line)
    assert "uq_quota_usages_partition_scope_type_scope_resource" in text_plan
    assert "scope)::text = 'root.q1'" in condition, text_plan


def test_reservation_lookup_by_key_uses_the_key_index(pg: tuple[QuotaEngine, Connection]) -> None:
    _, conn = pg
    text_plan = plan(conn, reservations.PG_FIND_BY_KEY, {"p": "default", "key": "k"})
    assert "uq_reservations_partition_key" in text_plan


def function_statement(conn: Connection, function: str, pattern: str, variables: dict[str, str]) -> str:
    """The statement of ``function`` matching ``pattern``, as installed, ``INTO`` removed and the
    PL/pgSQL variables (name -> type) replaced by ``$1``, ``$2``, ... in the order given."""
    body = conn.execute(
        text("SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.proname = :f"), {"f": function}
    ).scalar_one()
    found = re.search(pattern, body, re.DOTALL)
    assert found is not None, f"{pattern!r} not in {function}"
    statement = re.sub(r"\bINTO\s+\w+(\s*,\s*\w+)*", "", found.group(0).rstrip(";"), count=1)
    for number, name in enumerate(variables, start=1):
        statement = re.sub(rf"\b{name}\b", f"${number}", statement)
    return statement


def prepared_plans(conn: Connection, statement: str, types: list[str], values: str) -> dict[str, str]:
    """EXPLAIN of the prepared statement, per plan cache mode."""
    conn.exec_driver_sql(f"PREPARE explained({', '.join(types)}) AS {statement}")
    plans = {}
    for mode in ("force_custom_plan", "force_generic_plan"):
        conn.exec_driver_sql(f"SET plan_cache_mode = {mode}")
        rows = conn.exec_driver_sql(f"EXPLAIN EXECUTE explained({values})").fetchall()
        plans[mode] = "\n".join(row[0] for row in rows)
    conn.exec_driver_sql("DEALLOCATE explained")
    return plans


def test_the_expiry_function_finds_its_batch_by_the_pending_expiry_index(
    pg: tuple[QuotaEngine, Connection],
) -> None:
    _, conn = pg
    version = conn.execute(text("SELECT version FROM quota_config_head")).scalar_one()
    expired = conn.execute(
        text("SELECT quota_ledger_expire('default', 10, '{}'::text[], :v, :ns, :k)"),
        {"v": version, "ns": ADVISORY_NAMESPACE, "k": advisory_key("default")},
    ).scalar_one()
    assert expired == 0  # the function runs here, and nothing has expired yet
    # The batch: the queues of the oldest expired reservations, then those queues' rows.
    variables = {"p_partition": "text", "v_now": "timestamp", "p_limit": "integer", "p_skip_queues": "text[]"}
    pattern = r"SELECT array_agg\(b\.id\).*?\) AS b;"
    batch = function_statement(conn, "quota_ledger_expire", pattern, variables)
    assert "FOR UPDATE SKIP LOCKED" in batch
    plans = prepared_plans(conn, batch, list(variables.values()), "'default', '2000-01-01', 10, '{}'")
    for mode, text_plan in plans.items():
        assert "ix_reservations_partition_state_expires_at" in text_plan, (mode, text_plan)
        assert "ix_reservations_partition_queue_state_expires_at" in text_plan, (mode, text_plan)
        assert "Seq Scan" not in text_plan, (mode, text_plan)


def _full_scans(text_plan: str, index: str) -> list[str]:
    """The scans of ``index`` in a plan without an index condition (a walk over the whole index)."""
    lines = text_plan.splitlines()
    return [
        line
        for line, after in zip(lines, [*lines[1:], ""], strict=True)
        if f"using {index} on" in line and "Index Cond" not in after
    ]


def test_application_rows_are_found_by_key_before_any_statistics(postgres_url: URL) -> None:
    """A generic plan is made once per connection and kept. While ``quota_applications`` has no
    statistics (as in a new database), every index that starts with ``partition`` costs the same
    for a lookup by ``(partition, app_key)``: the plan must still take the key's index."""
    engine = create_engine(normalize_url(postgres_url))
    with engine.connect() as conn:
        reltuples = conn.execute(
            text("SELECT reltuples FROM pg_class WHERE relname = 'quota_applications'")
        ).scalar_one()
        assert reltuples <= 0  # never analyzed, or analyzed empty
        conn.execute(text("SET enable_seqscan = off"))
        lookup = function_statement(
            conn,
            "quota_ledger_reserve_many",
            r"SELECT array_agg\(DISTINCT p_app_keys\[n\]\).*?;",
            {"p_partition": "text", "p_app_keys": "text[]", "v_inserted": "integer[]"},
        )
        plans = prepared_plans(conn, lookup, ["text", "text[]", "integer[]"], "'default', '{a}', '{1}'")
        for mode, text_plan in plans.items():
            assert "uq_quota_applications_partition_app_key" in text_plan, (mode, text_plan)
            assert "_name on quota_applications" not in text_plan, (mode, text_plan)
    engine.dispose()


def test_a_commit_updates_application_rows_by_lookups_whatever_the_table_size(postgres_url: URL) -> None:
    """Statistics taken while the table was small must not make the commit join its application
    rows with the whole table: it finds each by its id and updates it at its address."""
    engine = create_engine(normalize_url(postgres_url))
    with engine.connect() as conn:
        conn.execute(
            text(
                "INSERT INTO quota_applications (partition, app_key, application, user_name, queue, state,"
                " pending, usage, area, submitted_at, changed_at)"
                " SELECT 'default', 'app-' || g, 'app-' || g, 'u', 'root.a', 'running', 0, '{}', '{}',"
                " now(), now() FROM generate_series(1, 200) AS g"
            )
        )
        conn.execute(text("ANALYZE quota_applications"))
        conn.execute(text("SET enable_seqscan = off"))
        variables = {
            "v_ns": "integer[]",
            "v_parts": "text[]",
            "v_keys": "text[]",
            "i_ns": "integer[]",
            "i_resources": "text[]",
            "i_amounts": "bigint[]",
            "v_now": "timestamp",
        }
        pattern = r"WITH mine AS \(.*?WHERE a\.ctid = c\.tid;"
        update = function_statement(conn, "quota_ledger_commit_many", pattern, variables)
        values = "'{1}', '{default}', '{app-1}', '{1}', '{fpga}', '{1}', '2000-01-01'"
        plans = prepared_plans(conn, update, list(variables.values()), values)
        for mode, text_plan in plans.items():
            assert not _full_scans(text_plan, "pk_quota_applications"), (mode, text_plan)
        # and a reserve charges them the same way
        variables = {
            "p_partition": "text",
            "v_admitted": "integer[]",
            "p_app_keys": "text[]",
            "p_item_owners": "integer[]",
            "p_item_resources": "text[]",
            "p_item_amounts": "bigint[]",
        }
        pattern = r'UPDATE quota_applications a SET "usage" = d\.usage::text.*?;'
        update = function_statement(conn, "quota_ledger_reserve_many", pattern, variables)
        values = "'default', '{1}', '{app-1}', '{1}', '{fpga}', '{1}'"
        plans = prepared_plans(conn, update, list(variables.values()), values)
        for mode, text_plan in plans.items():
            assert not _full_scans(text_plan, "pk_quota_applications"), (mode, text_plan)
        conn.rollback()
    engine.dispose()
