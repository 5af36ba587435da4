"""Alembic environment: metadata comes from the package, the connection from the caller."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from quota_ledger.driver.dialect import build_engine
from quota_ledger.driver.migrate import VERSION_TABLE
from quota_ledger.driver.schema import exists_on, metadata
from quota_ledger.runtime import location

config = context.config


def run(connection: Connection) -> None:
    dialect = connection.dialect.name

    def include_object(
        item: object, name: str | None, type_: str, reflected: bool, compare_to: object
    ) -> bool:
        """Columns and indexes the migrations make on other engines only are not compared."""
        return exists_on(item, dialect)

    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        compare_type=True,
        include_object=include_object,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run(connection)
        return
    # Command-line alembic: this file is an entry point, so it may read the environment.
    url = config.get_main_option("sqlalchemy.url") or os.environ.get(
        "QUOTA_LEDGER_DB", location.default_db_url()
    )
    engine = build_engine(url)
    try:
        with engine.connect() as conn:
            run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
main()
