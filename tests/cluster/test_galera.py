"""The ledger on a three-node MariaDB Galera cluster: migrated and written on node 1 (the single
writer), read on the others, keyless reservations written on two nodes at once without
certification conflicts, and a node killed with ``kill -9`` rejoining with identical tables.

The steps run in order in one test, on one cluster (fixture ``galera``)."""

from __future__ import annotations

from collections.abc import Iterator

import keyless_load
import pymysql
import pytest
from galera import GaleraCluster, GaleraNode
from polling import eventually

from quota_ledger import QuotaEngine, Usage
from quota_ledger.driver import migrate
from quota_ledger.driver.schema import metadata

pytestmark = pytest.mark.cluster

DATABASE = "ledger"
TABLES = sorted(t.name for t in metadata.sorted_tables)


@pytest.fixture(scope="module")
def urls(galera: GaleraCluster) -> list[str]:
    """A database on the cluster, migrated on node 1; one URL per node."""
    made = galera.create_database(DATABASE)
    with QuotaEngine.from_url(made[0]) as engine:
        engine.migrate()
    return made


@pytest.fixture(scope="module")
def writer(urls: list[str]) -> Iterator[QuotaEngine]:
    with QuotaEngine.from_url(urls[0]) as engine:
        yield engine


def _usage(url: str, queue: str) -> dict[str, Usage]:
    with QuotaEngine.from_url(url) as engine:
        return engine.usage(queue)


def _checksums(node: GaleraNode) -> dict[str, int]:
    rows = node.query(f"CHECKSUM TABLE {', '.join(f'`{DATABASE}`.`{t}`' for t in TABLES)} EXTENDED")
    return {str(name): int(value) for name, value in rows}


def _checksums_agree(galera: GaleraCluster) -> bool:
    return len({tuple(sorted(_checksums(node).items())) for node in galera.nodes}) == 1


def _table_names(node: GaleraNode) -> set[str]:
    try:
        return {str(row[0]) for row in node.query(f"SHOW TABLES FROM `{DATABASE}`")}
    except pymysql.err.OperationalError:  # the database itself is not there yet
        return set()


def _version(node: GaleraNode) -> list[tuple[object, ...]]:
    return node.query(f"SELECT version_num FROM `{DATABASE}`.quota_ledger_alembic_version")


def _schema_is_on_every_node(galera: GaleraCluster) -> None:
    """The other nodes apply the migration's DDL and its version row shortly after node 1."""
    for node in galera.nodes:
        assert eventually(lambda node=node: _table_names(node) >= set(TABLES), True), node.name
        head = [(migrate.head(),)]
        assert eventually(lambda node=node: _version(node), head) == head, node.name


def _writes_on_the_writer_are_read_on_every_node(urls: list[str], writer: QuotaEngine) -> None:
    writer.set_limits("root.team", {"fpga": 10, "memory": "64Gi"})
    committed = writer.reserve("root.team", {"fpga": 3, "memory": "8Gi"}, key="job-1")
    writer.commit(committed.id)
    pending = writer.reserve("root.team", {"fpga": 2})
    expected = writer.usage("root.team")
    assert expected["fpga"] == Usage(in_use=3, reserved=2, limit=10)
    for url in urls[1:]:
        assert eventually(lambda url=url: _usage(url, "root.team"), expected) == expected
        with QuotaEngine.from_url(url) as reader:
            assert reader.get(pending.id) == pending
            assert reader.get_by_key("job-1").state.value == "committed"
    assert writer.audit() == []


def _keyless_reservations_on_two_nodes_meet_no_conflict(urls: list[str]) -> None:
    """Galera would certify a NULL key in a unique index as one value (migration 0008)."""
    keyless_load.prepare(urls[:2], 1)
    result = keyless_load.run(urls[:2], 3)
    print(result.summary())
    assert all(result.reserves[url] > 20 for url in urls[:2]), result.summary()
    assert result.errors == {}, result.summary()
    assert result.conflicts == 0, result.summary()
    with QuotaEngine.from_url(urls[0]) as engine:
        assert engine.audit() == []


def _a_killed_node_rejoins_with_identical_tables(
    galera: GaleraCluster, urls: list[str], writer: QuotaEngine
) -> None:
    node3 = galera.nodes[2]
    node3.kill()
    galera.wait_size(2, on=galera.nodes[0])
    # Writes go on without it; it catches up with them when it rejoins (IST).
    writer.set_limits("root.while-down", {"fpga": 5})
    made = [writer.reserve("root.while-down", {"fpga": 1}) for _ in range(3)]
    writer.commit(made[0].id)
    writer.rollback(made[1].id)
    node3.start()
    galera.wait_size(3, on=node3)
    # Node 1's last writes may still be being applied on node 2 (a write set is certified
    # everywhere before the commit returns, applied asynchronously after).
    assert eventually(lambda: _checksums_agree(galera), True), [_checksums(n) for n in galera.nodes]
    sums = [_checksums(node) for node in galera.nodes]
    assert sums[0] == sums[1] == sums[2]
    assert sums[0][f"{DATABASE}.reservations"] != 0
    with QuotaEngine.from_url(urls[2]) as rejoined:
        assert rejoined.usage("root.while-down")["fpga"] == Usage(in_use=1, reserved=1, limit=5)
        assert rejoined.get(made[2].id) == made[2]
        assert rejoined.audit() == []


def test_the_ledger_on_galera_replicates_avoids_conflicts_and_survives_a_killed_node(
    galera: GaleraCluster, urls: list[str], writer: QuotaEngine
) -> None:
    """One test, in steps: each step builds on the one before, and the cluster takes half a
    minute to start, so they must share one (a parallel run would split separate tests)."""
    _schema_is_on_every_node(galera)
    _writes_on_the_writer_are_read_on_every_node(urls, writer)
    _keyless_reservations_on_two_nodes_meet_no_conflict(urls)
    _a_killed_node_rejoins_with_identical_tables(galera, urls, writer)
