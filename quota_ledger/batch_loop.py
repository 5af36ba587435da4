"""The expiry sweep's batch loop: batches until one comes back short, on one or several threads.

Every batch is its own transaction that skips rows another sweeper holds, so threads (or
processes) sweeping the same partition never wait for each other's reservations and an
interrupted sweep loses nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class Budget:
    """At most ``max_batches`` batches in all (None: no limit), shared by every thread."""

    def __init__(self, max_batches: int | None) -> None:
        self._left = max_batches
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self._left is None:
                return True
            if self._left <= 0:
                return False
            self._left -= 1
            return True


def run(batch: Callable[[], int], batch_size: int, budget: Budget, workers: int = 1) -> int:
    """Call ``batch`` (which expires up to ``batch_size`` rows and says how many) until a
    batch comes back short or the budget is spent, on ``workers`` threads; the total."""

    def loop() -> int:
        total = 0
        while budget.take():
            count = batch()
            total += count
            if count < batch_size:
                break
        return total

    if workers == 1:
        return loop()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="quota-ledger-sweep") as pool:
        futures = [pool.submit(loop) for _ in range(workers)]
        return sum(future.result() for future in futures)
