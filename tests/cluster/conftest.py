"""Clusters of the tests' own: a three-node Galera cluster and a PostgreSQL primary with a hot
standby, one per test module; a failure to set one up fails the tests (no skip).

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
def galera() -> Iterator[GaleraCluster]:
    """Three synced nodes; node 1 bootstrapped the group."""
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
