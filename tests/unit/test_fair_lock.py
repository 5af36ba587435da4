"""FairLock: reentrant, and its waiters get the lock in the order they came."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from quota_ledger.driver.fair_lock import FairLock


def test_waiters_are_served_in_the_order_they_came() -> None:
    lock = FairLock()
    served: list[int] = []
    lock.acquire()
    threads = []
    for i in range(8):
        thread = threading.Thread(target=lambda i=i: (lock.acquire(), served.append(i), lock.release()))
        thread.start()
        threads.append(thread)
        time.sleep(0.02)  # each is queued before the next starts
    lock.release()
    for thread in threads:
        thread.join(5)
    assert served == list(range(8))


def test_reentrant_and_released_only_by_its_holder() -> None:
    lock = FairLock()
    with lock, lock:
        other: list[bool] = []
        thread = threading.Thread(target=lambda: other.append(_try_release(lock)))
        thread.start()
        thread.join(5)
        assert other == [False]
    taken = threading.Event()
    thread = threading.Thread(target=lambda: (lock.acquire(), taken.set(), lock.release()))
    thread.start()
    assert taken.wait(5)  # fully released after the outer block
    thread.join(5)


def _try_release(lock: FairLock) -> bool:
    try:
        lock.release()
    except RuntimeError:
        return False
    return True


def test_sqlite_driver_queues_its_transactions_on_a_fair_lock(tmp_path: Path) -> None:
    from quota_ledger import QuotaEngine

    engine = QuotaEngine.from_url(f"sqlite:///{tmp_path}/l.db")
    try:
        assert isinstance(engine.driver._one_at_a_time, FairLock)
    finally:
        engine.close()
