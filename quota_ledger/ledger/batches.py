"""The expiry sweep's batch loop: batches until one comes back short, on one or several threads.

Every batch is its own transaction that skips rows another sweeper holds, so threads (or
processes) sweeping the same partition never wait for each other's reservations and an
interrupted sweep loses nothing. A :class:`Pacer` holds the loop to a rate, so that working
off a backlog takes a bounded share of the database instead of all it can get.
"""

from __future__ import annotations

import threading
import time
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


class Pacer:
    """At most ``rate`` rows per second on average since the pacer was made, shared by every
    thread (None: no limit). After a batch, :meth:`done` sleeps until the rows swept so far
    are due: a fast batch is followed by a pause, a slow one by none."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._clock = clock
        self._started = clock()
        self._rows = 0
        self._lock = threading.Lock()

    def done(self, rows: int, sleep: Callable[[float], None] = time.sleep) -> None:
        """Count a finished batch's rows and wait until they are due."""
        if self._rate is None:
            return
        with self._lock:
            self._rows += rows
            due = self._started + self._rows / self._rate
        pause = due - self._clock()
        if pause > 0:
            sleep(pause)


def run(
    batch: Callable[[], int],
    batch_size: int,
    budget: Budget,
    workers: int = 1,
    pacer: Pacer | None = None,
) -> int:
    """Call ``batch`` (which expires up to ``batch_size`` rows and says how many) until a
    batch comes back short or the budget is spent, on ``workers`` threads, at the pace of
    ``pacer``; the total."""
    pace = pacer or Pacer(None)

    def loop() -> int:
        total = 0
        while budget.take():
            count = batch()
            total += count
            if count < batch_size:
                break
            pace.done(count)
        return total

    if workers == 1:
        return loop()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="quota-ledger-sweep") as pool:
        futures = [pool.submit(loop) for _ in range(workers)]
        return sum(future.result() for future in futures)
