"""PostgreSQL reads the text form of the arrays the driver sends to the ledger's functions as
the very values of the Python lists (any text, NULL, 64-bit integers)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine
from sqlalchemy.engine import URL

from quota_ledger.driver.pg_cursor import with_text_arrays

# what PostgreSQL text holds: UTF-8 (no lone surrogate), without NUL
_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))
_BIGINT = st.integers(-(2**63), 2**63 - 1)


def test_the_server_reads_back_what_was_sent(postgres_url: URL) -> None:
    engine = create_engine(postgres_url.set(drivername="postgresql+psycopg"))
    try:
        raw = engine.raw_connection()
        try:
            conn = raw.driver_connection
            assert conn is not None

            @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
            @given(st.lists(st.none() | _TEXT), st.lists(_BIGINT))
            def check(texts: list[str | None], numbers: list[int]) -> None:
                sent = with_text_arrays({"t": texts, "n": numbers})
                row = conn.execute("SELECT %(t)s::text[], %(n)s::bigint[]", sent).fetchone()
                assert row == (texts, numbers)

            check()
        finally:
            raw.close()
    finally:
        engine.dispose()
