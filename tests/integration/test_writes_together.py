"""The writes that end a set go together: on MariaDB as one compound statement.

A set's inserts and counter updates read nothing they write, so ``LedgerTx.writes_together``
holds them until its block ends and sends them in order, on MariaDB as one ``BEGIN NOT
ATOMIC ... END`` (one round trip), on SQLite one after another. A block left by an error sends
nothing, and an error inside the compound statement is the statement's own, classified as
any other.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, exc, select
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine, QuotaLedgerError
from quota_ledger.driver import dialect
from quota_ledger.driver.schema import quota_journal, quota_usages
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.model.values import Reservation, ReservationState

QUEUES = [f"root.w{i}" for i in range(3)]


@pytest.fixture
def engine(core_db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(core_db_url)
    engine.driver.run(lambda tx: tx.create_missing("default", [(q, "fpga") for q in QUEUES], tx.db_now()))
    yield engine
    engine.close()


def _ids(tx: LedgerTx) -> list[int]:
    return sorted(c.id for c in tx.lock_queue_counters("default", [(q, "fpga") for q in QUEUES]).values())


def _values(engine: QuotaEngine) -> list[tuple[int, int]]:
    def work(tx: LedgerTx) -> list[tuple[int, int]]:
        c = quota_usages.c
        rows = tx.conn.execute(select(c.in_use, c.reserved).where(c.scope.in_(QUEUES)).order_by(c.scope))
        return [(row.in_use, row.reserved) for row in rows]

    return engine.driver.run(work)


def _journal(engine: QuotaEngine) -> int:
    return len(engine.driver.run(lambda tx: tx.conn.execute(select(quota_journal.c.id)).all()))


def _reservation(n: int) -> Reservation:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return Reservation(
        id=f"00000000-0000-4000-8000-{n:012d}",
        state=ReservationState.PENDING,
        partition="default",
        queue=QUEUES[0],
        resources={"fpga": n},
        created_at=now,
        expires_at=now + timedelta(minutes=5),
    )


def test_the_writes_of_a_block_go_in_order_when_it_ends(engine: QuotaEngine, core_db_url: URL) -> None:
    sent: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    def work(tx: LedgerTx) -> None:
        ids = _ids(tx)
        now = tx.db_now()
        event.listen(tx.conn, "before_cursor_execute", count)
        with tx.writes_together():
            tx.insert_reservations([(_reservation(n), f"h{n}", None) for n in (1, 2)])
            tx.append_journal_rows(
                [
                    {
                        "partition": "default",
                        "queue": QUEUES[0],
                        "resource": "fpga",
                        "delta": 3,
                        "kind": "commit",
                        "reservation_id": _reservation(1).id,
                        "operation_id": "op-1",
                        "created_at": now,
                    }
                ]
            )
            tx.apply_counter_deltas({cid: (n, 2 * n) for n, cid in enumerate(ids, 1)}, now)
            tx.apply_counter_deltas({ids[0]: (10, 0)}, now)  # after the first: adds to it
            assert sent == []  # nothing sent before the block ends

    engine.driver.run(work)
    assert _values(engine) == [(11, 2), (2, 4), (3, 6)]
    assert _journal(engine) == 1
    assert [engine.get(_reservation(n).id).resources for n in (1, 2)] == [{"fpga": 1}, {"fpga": 2}]
    if core_db_url.get_backend_name() == "mysql":
        assert len(sent) == 1
        assert sent[0].startswith("BEGIN NOT ATOMIC")
    else:
        assert len(sent) == 5  # headers, items, journal, and the two updates


def test_a_block_left_by_an_error_sends_nothing(engine: QuotaEngine) -> None:
    def work(tx: LedgerTx) -> None:
        ids = _ids(tx)
        with tx.writes_together():
            tx.apply_counter_deltas({cid: (1, 1) for cid in ids}, tx.db_now())
            raise RuntimeError("left")

    with pytest.raises(RuntimeError):
        engine.driver.run(work)
    assert _values(engine) == [(0, 0)] * 3


def test_an_error_inside_the_writes_is_the_statements_own(engine: QuotaEngine) -> None:
    seen: list[str] = []

    def work(tx: LedgerTx) -> None:
        ids = _ids(tx)
        now = tx.db_now()
        savepoint = tx.conn.begin_nested()
        try:
            with tx.writes_together():
                tx.apply_counter_deltas({ids[0]: (5, 0)}, now)
                row = {"partition": "default", "queue": QUEUES[0], "resource": "fpga", "delta": 5}
                # operation_id is NOT NULL: the second statement fails
                tx.append_journal_rows([{**row, "kind": "commit", "operation_id": None, "created_at": now}])
        except exc.DBAPIError as error:
            seen.append(dialect.classify(error))
            savepoint.rollback()  # what the statement did before it failed is undone with it
            raise

    with pytest.raises(QuotaLedgerError):
        engine.driver.run(work)
    assert seen == [dialect.FATAL]
    assert _values(engine) == [(0, 0)] * 3
    assert _journal(engine) == 0
