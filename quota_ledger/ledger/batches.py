"""The expiry sweep's batch loop: batches until one comes back short, on one or several threads.

Every batch is its own transaction that skips rows another sweeper holds, so threads (or
processes) sweeping the same partition never wait for each other's reservations and an
interrupted sweep loses nothing. A :class:`Pacer` holds the loop to a rate, so that working
off a backlog takes a bounded share of the database instead of all it can get.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("quota_ledger.sweeper")


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


class SetAside:
    """Reservations whose expiry failed on their own, by partition: later sweeps skip them.

    One reservation the ledger cannot expire (a statement the database refuses for its rows, a
    counter its release would take out of range) must not stop the expiry of every other: the
    sweep bisects a batch that fails until the reservation is alone in it, and sets that one
    aside here, logged at ERROR with its id and the error. Nothing is written: the reservation
    stays pending, holding what it reserved, until someone resolves it (a rollback, or a fix and
    a restart). The memory is the process's, shared by every thread of a sweep: the service's
    sweeper keeps one for its life, so a restarted process tries such a reservation again; an
    ``expire()`` call given none uses its own.
    """

    def __init__(self) -> None:
        self._ids: dict[str, dict[str, str]] = {}  # partition -> id -> why
        self._lock = threading.Lock()

    def add(self, partition: str, reservation_id: str, error: BaseException) -> None:
        """Set a reservation aside, logging its id and the error (with its cause)."""
        with self._lock:
            self._ids.setdefault(partition, {})[reservation_id] = f"{type(error).__name__}: {error}"
        log.error(
            "reservation %s (partition %r) cannot be expired; it is set aside and stays pending: %s",
            reservation_id,
            partition,
            error,
            exc_info=error,
        )

    def ids(self, partition: str) -> frozenset[str]:
        """The reservations of ``partition`` set aside."""
        with self._lock:
            return frozenset(self._ids.get(partition, ()))

    def reasons(self) -> dict[str, str]:
        """Every reservation set aside: id -> the error its expiry met."""
        with self._lock:
            return {rid: why for found in self._ids.values() for rid, why in found.items()}

    def __len__(self) -> int:
        with self._lock:
            return sum(len(found) for found in self._ids.values())


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
    set_aside: SetAside | None = None,
) -> int:
    """Call ``batch`` (which expires up to ``batch_size`` rows and says how many) until a
    batch comes back short or the budget is spent, on ``workers`` threads, at the pace of
    ``pacer``; the total. A row the batch set aside in ``set_aside`` counts for its length
    (the batch had it), not for the total."""
    pace = pacer or Pacer(None)

    def loop() -> int:
        total = 0
        while budget.take():
            before = len(set_aside) if set_aside is not None else 0
            count = batch()
            total += count
            taken = count + (len(set_aside) - before if set_aside is not None else 0)
            if taken < batch_size:
                break
            pace.done(count)
        return total

    if workers == 1:
        return loop()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="quota-ledger-sweep") as pool:
        futures = [pool.submit(loop) for _ in range(workers)]
        return sum(future.result() for future in futures)
