"""Plain SQL on a test database, in a connection of its own: what the tests read and write
around the ledger (rows left, a clock moved back, a row hidden); and what an engine sends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.driver.dialect import normalize_url


def rows(url: URL, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """The rows ``sql`` returns."""
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql), dict(params or {}))]
    finally:
        engine.dispose()


def execute(url: URL, sql: str, params: Mapping[str, Any] | None = None) -> None:
    """Run ``sql`` and commit."""
    engine = create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(text(sql), dict(params or {}))
    finally:
        engine.dispose()


class Statements:
    """Counts the statements an engine sends (an executemany counts once)."""

    def __init__(self, engine: QuotaEngine) -> None:
        self.count = 0
        event.listen(engine.driver.engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        self.count += 1
