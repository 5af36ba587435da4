"""Creating a counter that already exists leaves it exactly as it is.

Reservations create the counters they use for the first time, and two first uses of one
counter race: the second insert meets the first's row and skips it. On MariaDB that skip is an
``ON DUPLICATE KEY UPDATE`` of the row's key; updating it to anything but itself would move the
row to a new id, and a locking read waiting on the row meanwhile could then miss it: a commit
would not count its usage, and a release would be refused as more than is in use.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator

import pytest
from sqlalchemy import select
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.driver.schema import quota_identity_usages, quota_usages
from quota_ledger.driver.tx import LedgerTx

CONFIG = {
    "partitions": [
        {
            "name": "default",
            "queues": [
                {
                    "name": "root",
                    "queues": [
                        {
                            "name": "q",
                            "resources": {"max": {"fpga": 8}},
                            "limits": [{"users": ["*"], "maxresources": {"fpga": 4}}],
                        }
                    ],
                }
            ],
        }
    ]
}
PAIRS = [("root.q", "fpga"), ("root.q", "gpu")]


@pytest.fixture
def ledger(db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(db_url, pool_size=12)
    engine.apply_config(CONFIG)
    yield engine
    engine.close()


def _rows(tx: LedgerTx) -> list[tuple[object, ...]]:
    found = []
    for table in (quota_usages, quota_identity_usages):
        c = table.c
        stmt = select(c.id, c.in_use, c.reserved, c.hard_limit).order_by(c.id)
        found += [tuple(row) for row in tx.conn.execute(stmt)]
    return found


def test_inserting_counters_that_exist_keeps_their_ids_and_values(ledger: QuotaEngine) -> None:
    made = ledger.reserve("root.q", {"fpga": 2, "gpu": 1}, user="alice", application="a1")
    ledger.commit(made.id, {"fpga": 2})
    before = ledger.driver.run(_rows)

    def insert_again(tx: LedgerTx) -> None:
        now = tx.db_now()
        tx.create_missing("default", PAIRS, now)
        tx.insert_identity_counters("default", {("user", "alice", "root.q", "fpga"): (0, 0, 99)}, now)

    ledger.driver.run(insert_again)
    assert ledger.driver.run(_rows) == before
    assert ledger.audit() == []
    ledger.release("root.q", {"fpga": 2}, user="alice", application="a1", finished=True)
    assert ledger.audit() == []


def test_locking_reads_find_counters_while_first_uses_race(server_db_url: URL) -> None:
    """Twelve threads add to two existing counters; two transactions in three first insert
    them again, as a reservation that raced another first use does. Every locking read
    finds both counters, and no addition is lost."""
    ledger = QuotaEngine.from_url(server_db_url, pool_size=16)
    ledger.apply_config(CONFIG)
    ledger.driver.run(lambda tx: tx.create_missing("default", PAIRS, tx.db_now()))
    stop = time.monotonic() + 5.0
    tally: Tally[str] = Tally()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def add_one(tx: LedgerTx, again: bool) -> int:
        now = tx.db_now()
        if again:
            tx.insert_queue_counters("default", PAIRS, now)
        own = tx.lock_queue_counters("default", PAIRS)
        if len(own) == len(PAIRS):
            tx.apply_counter_deltas({c.id: (1, 0) for c in own.values()}, now)
        return len(own)

    def worker(n: int) -> None:
        i = 0
        try:
            while time.monotonic() < stop:
                i += 1
                again = (n + i) % 3 != 0
                found = ledger.driver.run(lambda tx, again=again: add_one(tx, again))
                with lock:
                    tally["added" if found == len(PAIRS) else "missed"] += 1
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        assert not errors, errors
        assert tally["missed"] == 0, tally
        assert tally["added"] > 20, tally
        counters = ledger.driver.run(lambda tx: tx.lock_queue_counters("default", PAIRS))
        assert {pair: c.in_use for pair, c in counters.items()} == dict.fromkeys(PAIRS, tally["added"])
    finally:
        ledger.close()
