"""Migrations on every backend: up, down, up again; no drift between models and migrations."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine, SchemaNotReady
from quota_ledger.driver import migrate
from quota_ledger.driver.schema import metadata

REPO = Path(__file__).resolve().parents[2]
LEDGER_TABLES = {t.name for t in metadata.sorted_tables}


def _tables(engine: QuotaEngine) -> set[str]:
    return set(inspect(engine.driver.engine).get_table_names())


def test_upgrade_downgrade_upgrade_round_trip(empty_db: URL) -> None:
    with QuotaEngine.from_url(empty_db) as engine:
        assert migrate.current(engine.driver.engine) is None
        engine.migrate()
        assert migrate.current(engine.driver.engine) == "0019"
        assert _tables(engine) >= LEDGER_TABLES
        migrate.downgrade(engine.driver.engine, "base")
        assert migrate.current(engine.driver.engine) is None
        assert not LEDGER_TABLES & _tables(engine)
        engine.migrate()
        migrate.check(engine.driver.engine)
        engine.set_limits("root.a", {"fpga": 1})
        assert engine.usage("root.a")["fpga"].limit == 1


def test_downgrading_0009_keeps_the_version_in_force_as_a_snapshot(empty_db: URL) -> None:
    """0008 reads only whole snapshots: the downgrade stores the version set_limits made."""
    with QuotaEngine.from_url(empty_db) as engine:
        engine.migrate()
        engine.apply_config({"partitions": [{"queues": [{"name": "root", "queues": [{"name": "a"}]}]}]})
        engine.set_limits("root.a", {"fpga": 2})
        version = engine.set_limits("root", {"fpga": 9})
        document = engine.config()
        migrate.downgrade(engine.driver.engine, "0008")
        with engine.driver.engine.connect() as conn:
            head = conn.execute(text("SELECT version FROM quota_config_head")).scalar_one()
            stored = conn.execute(text("SELECT capacity FROM quota_configs WHERE version = :v"), {"v": head})
            assert (head, stored.scalar_one()) == (version, '{"default": {"fpga": 9}}')
        engine.migrate()
    with QuotaEngine.from_url(empty_db) as engine:
        assert engine.config() == document
        assert engine.limits() == {"root": {"fpga": 9}, "root.a": {"fpga": 2}}


def test_models_and_migrations_do_not_drift(empty_db: URL) -> None:
    with QuotaEngine.from_url(empty_db) as engine:
        engine.migrate()
        migrate.check(engine.driver.engine)  # raises alembic.util.CommandError on drift


def test_migrate_twice_is_a_no_op(empty_db: URL) -> None:
    with QuotaEngine.from_url(empty_db) as engine:
        engine.migrate()
        engine.set_limits("root.a", {"fpga": 3})
        engine.migrate()
        assert engine.limits() == {"root.a": {"fpga": 3}}


def test_unmigrated_database_raises_schema_not_ready(empty_db: URL) -> None:
    with QuotaEngine.from_url(empty_db) as engine, pytest.raises(SchemaNotReady):
        engine.reserve("root.a", {"fpga": 1})


def test_constraint_names_follow_the_naming_convention(empty_db: URL) -> None:
    with QuotaEngine.from_url(empty_db) as engine:
        engine.migrate()
        inspector = inspect(engine.driver.engine)
        uniques = {u["name"] for u in inspector.get_unique_constraints("quota_usages")}
        assert "uq_quota_usages_partition_scope_type_scope_resource" in uniques
        checks = {c["name"] for c in inspector.get_check_constraints("quota_usages")}
        assert {"ck_quota_usages_in_use_nonnegative", "ck_quota_usages_reserved_nonnegative"} <= checks
        indexes = {i["name"] for i in inspector.get_indexes("reservations")}
        assert "ix_reservations_partition_state_expires_at" in indexes


def test_pending_and_key_indexes_are_partial_where_the_engine_has_them(empty_db: URL) -> None:
    with QuotaEngine.from_url(empty_db) as engine:
        engine.migrate()
        indexes = {i["name"]: i for i in inspect(engine.driver.engine).get_indexes("reservations")}
        backend = engine.driver.engine.dialect.name
    pending = indexes["ix_reservations_partition_state_expires_at"]
    by_queue = indexes["ix_reservations_partition_queue_state_expires_at"]
    assert by_queue["column_names"] == ["partition", "queue", "state", "expires_at"]
    assert pending["column_names"] == ["partition", "state", "expires_at"]
    where = {name: idx.get("dialect_options", {}).get(f"{backend}_where") for name, idx in indexes.items()}
    if backend in ("postgresql", "sqlite"):
        key = indexes["uq_reservations_partition_key"]
        assert key["unique"]
        assert "pending" in str(where[pending["name"]])
        assert "pending" in str(where[by_queue["name"]])
        assert "NOT NULL" in str(where[key["name"]]).upper()
    else:  # MariaDB has no partial indexes: full ones, same columns
        assert where[pending["name"]] is None
        assert where[by_queue["name"]] is None


@pytest.mark.parametrize("empty_db", ["mariadb"], indirect=True)
def test_no_unique_index_on_mariadb_holds_a_null_for_a_keyless_reservation(empty_db: URL) -> None:
    """Galera certifies a NULL in a unique index as one value: keyless rows on two nodes would
    conflict. Keys are unique through ``key_or_id``; lookups by key use a plain index."""
    with QuotaEngine.from_url(empty_db) as engine:
        engine.migrate()
        keyless = engine.reserve("root.a", {"fpga": 1})
        keyed = engine.reserve("root.a", {"fpga": 1}, key="k1")
        assert engine.reserve("root.a", {"fpga": 1}, key="k1") == keyed
        inspector = inspect(engine.driver.engine)
        nullable = {c["name"] for c in inspector.get_columns("reservations") if c["nullable"]}
        indexes = {i["name"]: i for i in inspector.get_indexes("reservations")}
        with engine.driver.engine.connect() as conn:
            slots = dict(conn.execute(text("SELECT id, key_or_id FROM reservations")).all())
            nulls = conn.execute(text("SELECT count(*) FROM reservations WHERE key_or_id IS NULL")).scalar()
            plan = (
                conn.execute(
                    text("EXPLAIN SELECT id FROM reservations WHERE `partition` = 'default' AND `key` = 'k1'")
                )
                .mappings()
                .one()
            )
    assert "uq_reservations_partition_key" not in indexes
    assert indexes["uq_reservations_partition_key_or_id"]["unique"]
    assert indexes["uq_reservations_partition_key_or_id"]["column_names"] == ["partition", "key_or_id"]
    assert not indexes["ix_reservations_partition_key"]["unique"]
    for index in indexes.values():  # key_or_id is declared nullable but never NULL
        if index["unique"]:
            assert not set(index["column_names"]) & (nullable - {"key_or_id"}), index
    assert nulls == 0
    assert slots == {keyless.id: "\t" + keyless.id, keyed.id: "k1"}
    assert plan["key"] == "ix_reservations_partition_key"


@pytest.mark.slow
def test_db_upgrade_works_from_an_installed_wheel(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(REPO)],
        check=True,
        capture_output=True,
    )
    wheel = next(dist.glob("quota_ledger-*.whl"))
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    assert (site / "quota_ledger" / "_migrations" / "env.py").is_file()
    # the PostgreSQL functions the migrations install (SQLite, below, never reads them)
    functions = sorted(p.name for p in (REPO / "quota_ledger" / "driver" / "sql").glob("*.sql"))
    assert functions
    assert sorted(p.name for p in (site / "quota_ledger" / "driver" / "sql").glob("*.sql")) == functions
    # and the frozen definitions the older revisions install, with the migration scripts
    frozen = sorted(p.name for p in (REPO / "migrations" / "sql").glob("*.sql"))
    assert frozen
    assert sorted(p.name for p in (site / "quota_ledger" / "_migrations" / "sql").glob("*.sql")) == frozen
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("QUOTA_LEDGER_DB", None)
    probe = subprocess.run(
        [sys.executable, "-c", "import quota_ledger.driver.migrate as m; print(m.script_location())"],
        cwd=workdir,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip().startswith(str(site))
    frozen_probe = subprocess.run(
        [sys.executable, "-c", "from quota_ledger.driver import sql; print(sql.frozen('reserve_v1'))"],
        cwd=workdir,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert frozen_probe.stdout.startswith("-- quota_ledger_reserve(")
    # The console script's default database is a SQLite file in the user's data directory.
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    result = subprocess.run(
        [sys.executable, "-m", "quota_ledger.cli", "db", "upgrade"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "schema at 0019" in result.stdout
    assert (tmp_path / "data" / "quota-ledger" / "ledger.db").is_file()
    assert list(workdir.iterdir()) == []
