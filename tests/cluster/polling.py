"""Reading a replica until it has applied what the writer committed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(read: Callable[[], T], expected: T, timeout: float = 10) -> T:
    """``read()`` until it returns ``expected`` or ``timeout`` seconds pass; the last value read.

    A Galera node applies a write set shortly after the writer's commit returns (unless the
    reading session sets ``wsrep_sync_wait``), a standby once it has replayed the WAL."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.05)
