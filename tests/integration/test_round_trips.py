"""What a transaction sends while it holds the shared counters, and after it has committed.

Every reservation of a partition locks the counters of the queues on its way to root until it
commits, so each round trip between that lock and the commit is one that every other
reservation waits for: adding to the locked counters is one statement however many there are
(PyMySQL would make an ``executemany`` of an UPDATE one round trip per row). After a commit a
MariaDB connection goes back to the pool without a ROLLBACK the server has nothing to undo for,
and one returned inside a transaction is still rolled back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.driver.inline import INLINE_SLICE
from quota_ledger.driver.schema import quota_partitions, quota_usages
from quota_ledger.driver.tx import LedgerTx

COUNTERS = INLINE_SLICE * 2 + 5


@pytest.fixture
def engine(db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(db_url)
    yield engine
    engine.close()


def _make_counters(engine: QuotaEngine) -> dict[str, int]:
    """Queue counters q000... of one resource, zeroed; their ids by queue."""
    queues = [f"root.q{i:03d}" for i in range(COUNTERS)]

    def work(tx: LedgerTx) -> dict[str, int]:
        now = tx.db_now()
        tx.create_missing("default", [(q, "fpga") for q in queues], now)
        return {
            c.scope: c.id for c in tx.lock_queue_counters("default", [(q, "fpga") for q in queues]).values()
        }

    return engine.driver.run(work)


def test_adding_to_locked_counters_adds_each_its_own_delta(engine: QuotaEngine) -> None:
    ids = _make_counters(engine)
    # Distinct deltas, some zero on one side, one zero on both (left alone), negatives too.
    deltas = {cid: (i % 7, i if i % 5 else 0) for i, cid in enumerate(sorted(ids.values()))}
    deltas[min(ids.values())] = (0, 0)

    def add(sign: int) -> None:
        def work(tx: LedgerTx) -> None:
            tx.lock_queue_counters("default", [(q, "fpga") for q in ids])
            tx.apply_counter_deltas(
                {cid: (sign * a, sign * b) for cid, (a, b) in deltas.items()}, tx.db_now()
            )

        engine.driver.run(work)

    def values() -> dict[int, tuple[int, int]]:
        def work(tx: LedgerTx) -> dict[int, tuple[int, int]]:
            c = quota_usages.c
            rows = tx.conn.execute(select(c.id, c.in_use, c.reserved).where(c.id.in_(list(ids.values()))))
            return {row.id: (row.in_use, row.reserved) for row in rows}

        return engine.driver.run(work)

    add(+1)
    add(+1)
    assert values() == {cid: (2 * a, 2 * b) for cid, (a, b) in deltas.items()}
    add(-1)
    assert values() == deltas


def test_adding_to_locked_counters_is_one_update_a_slice_and_one_round_trip_on_mariadb(
    core_db_url: URL,
) -> None:
    # (PostgreSQL sends one UPDATE of an unnest() on the psycopg cursor)
    engine = QuotaEngine.from_url(core_db_url)
    ids = _make_counters(engine)
    sent: list[tuple[str, bool]] = []

    def count(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if "UPDATE" in statement.upper():
            sent.append((statement, many))

    def work(tx: LedgerTx) -> None:
        tx.lock_queue_counters("default", [(q, "fpga") for q in ids])
        event.listen(tx.conn, "before_cursor_execute", count)
        tx.apply_counter_deltas({cid: (0, 1) for cid in ids.values()}, tx.db_now())

    try:
        engine.driver.run(work)
    finally:
        engine.close()
    slices = -(-COUNTERS // INLINE_SLICE)
    assert sum(statement.count("UPDATE quota_usages") for statement, _ in sent) == slices
    # MariaDB: one compound statement (BEGIN NOT ATOMIC ... END); SQLite: one each
    assert len(sent) == (1 if core_db_url.get_backend_name() == "mysql" else slices)
    assert not any(many for _, many in sent)


@pytest.fixture
def mariadb_engine(mariadb_url: URL) -> Iterator[QuotaEngine]:
    """(PyMySQL's rollback is MariaDB's: psycopg skips it without a transaction.)"""
    engine = QuotaEngine.from_url(mariadb_url, pool_size=1)
    yield engine
    engine.close()


def _rollbacks(tx: LedgerTx) -> int:
    row = tx.conn.execute(text("SHOW SESSION STATUS LIKE 'Com_rollback'")).one()
    return int(row[1])


def test_a_committed_connection_goes_back_without_a_rollback(mariadb_engine: QuotaEngine) -> None:
    first = mariadb_engine.driver.run(_rollbacks)
    mariadb_engine.driver.run(lambda tx: tx.db_now())
    assert mariadb_engine.driver.run(_rollbacks) == first


def test_a_connection_returned_inside_a_transaction_is_rolled_back(mariadb_engine: QuotaEngine) -> None:
    raw = mariadb_engine.driver.engine.raw_connection()
    cursor = raw.cursor()
    try:
        cursor.execute("INSERT INTO quota_partitions (name, created_at) VALUES ('open', UTC_TIMESTAMP())")
    finally:
        cursor.close()
        raw.close()  # back to the pool (of one) with the insert not committed

    def names(tx: LedgerTx) -> list[str]:
        return list(tx.conn.execute(select(quota_partitions.c.name)).scalars())

    assert "open" not in mariadb_engine.driver.run(names)
