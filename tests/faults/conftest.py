"""The fault tests' own PostgreSQL cluster (never the machine's service), one per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pg_cluster import PgCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    """A running throw-away cluster; a failure to set it up fails the tests (no skip)."""
    made = PgCluster()
    try:
        made.start()
        yield made
    finally:
        made.destroy()
