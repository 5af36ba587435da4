"""A reentrant lock that lets its waiters in first come, first served.

``threading.RLock`` wakes whichever waiter the scheduler picks: with many threads queued on one
lock some wait many turns in a row, and the latency of the unlucky ones (the p99) grows far past
the average. Here the thread that lets go hands the lock to the longest waiting one.
"""

from __future__ import annotations

import threading
from collections import deque
from types import TracebackType


class FairLock:
    """Reentrant; waiters are served in the order they came."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        #: (thread id, a lock held until it is that thread's turn)
        self._waiters: deque[tuple[int, threading.Lock]] = deque()

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._mutex:
            if self._owner == me:
                self._depth += 1
                return
            if self._owner is None:
                self._owner, self._depth = me, 1
                return
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append((me, turn))
        turn.acquire()  # released by the thread that hands the lock over, owner already set

    def release(self) -> None:
        with self._mutex:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a FairLock this thread does not hold")
            self._depth -= 1
            if self._depth:
                return
            if not self._waiters:
                self._owner = None
                return
            self._owner, turn = self._waiters.popleft()
            self._depth = 1
        turn.release()

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()
