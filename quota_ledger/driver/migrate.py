"""Alembic glue: find the migration scripts (in a checkout or an installed wheel) and run them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, inspect

from quota_ledger.model.errors import SchemaNotReady

#: our own version table, so the ledger can share a database with an application's alembic
VERSION_TABLE = "quota_ledger_alembic_version"


def script_location() -> Path:
    """``quota_ledger/_migrations`` in a wheel, ``migrations/`` next to the package in a checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise SchemaNotReady("the migration scripts are missing from this installation")


def alembic_config(engine: Engine | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if engine is not None:
        config.set_main_option(
            "sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%")
        )
    return config


def _run(engine: Engine, action: str, revision: str) -> None:
    config = alembic_config()
    with engine.connect() as conn:
        # SQLite: a migration that rebuilds a table (copy, drop, rename) would, with foreign keys
        # enforced, cascade the drop of the old ``reservations`` to its items. The pragma only
        # takes effect outside a transaction, so it is set on the driver's connection first.
        sqlite = _sqlite_connection(conn)
        if sqlite is not None:
            sqlite.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                config.attributes["connection"] = conn
                getattr(command, action)(config, revision)
        finally:
            if sqlite is not None:
                sqlite.execute("PRAGMA foreign_keys=ON")


def _sqlite_connection(conn: Connection) -> Any:
    """The sqlite3 connection under ``conn``, or None on another engine."""
    return conn.connection.driver_connection if conn.dialect.name == "sqlite" else None


def upgrade(engine: Engine, revision: str = "head") -> None:
    _run(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    _run(engine, "downgrade", revision)


def check(engine: Engine) -> None:
    """Raise if the models and the migrated schema disagree (``alembic check``)."""
    config = alembic_config()
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.check(config)


def current(engine: Engine) -> str | None:
    """The schema revision the database is at, or None if it was never migrated."""
    with engine.connect() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        row = conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").first()  # noqa: S608 - constant
        return None if row is None else str(row[0])


def head() -> str | None:
    """The newest revision the installed migration scripts know."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()
