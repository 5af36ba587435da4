"""A dump of every ledger table, to prove that a refused call changed nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from quota_ledger import QuotaEngine
from quota_ledger.driver.schema import exists_on, metadata


def dump(engine: QuotaEngine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every ledger table, in primary-key order, as the database returns it."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    backend = engine.driver.backend
    with engine.driver.engine.connect() as conn:
        for table in metadata.sorted_tables:
            columns = [c for c in table.columns if exists_on(c, backend)]
            order = list(table.primary_key.columns) or columns
            found[table.name] = [tuple(row) for row in conn.execute(select(*columns).order_by(*order))]
    return found
