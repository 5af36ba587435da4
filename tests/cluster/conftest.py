"""Clusters of the tests' own: a three-node Galera cluster and a PostgreSQL primary with a hot
standby, one per test module; a failure to set one up fails the tests (no skip; Galera on a
machine without MariaDB is the one exception, see ``galera``).

Every test here is marked ``cluster`` (``-m "not cluster"`` leaves them out). Each cluster serves
one test, whose steps build on each other: the xdist workers split a module's tests, and each
worker would start a cluster of its own (``--dist loadgroup`` does not keep groups together
with this pytest)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "faults"))  # pg_cluster

from galera import GaleraCluster
from pg_replication import PgReplication


@pytest.fixture(scope="module")
def galera(request: pytest.FixtureRequest) -> Iterator[GaleraCluster]:
    """Three synced nodes; node 1 bootstrapped the group.

    A machine without MariaDB's server (a fresh one: unlike PostgreSQL's, it comes with no wheel
    to fall back on) skips these tests, with the reason, unless the MariaDB tests were asked for
    (tests/conftest.py); then the missing programs fail them."""
    if missing := GaleraCluster.missing():
        try:
            request.getfixturevalue("mariadb_server")
        except pytest.skip.Exception as skipped:
            pytest.skip(f"no Galera cluster without {', '.join(missing)}, and {skipped.msg}")
    made = GaleraCluster.create()
    try:
        made.start()
        yield made
    finally:
        made.destroy()


@pytest.fixture(scope="module", params=["sync", "async"])
def replication(request: pytest.FixtureRequest) -> Iterator[PgReplication]:
    """A primary and a streaming hot standby, synchronous or not."""
    made = PgReplication(synchronous=request.param == "sync")
    try:
        made.start()
        yield made
    finally:
        made.destroy()
