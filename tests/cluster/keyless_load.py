"""Keyless reservations written on several Galera nodes at once, with the conflicts they meet.

Every writer thread has a queue of its own (``root.node1_0``, ``root.node2_0``, ...) in the
default partition, with limits it never reaches, and sends ``reserve`` calls without an
idempotency key to its node for a fixed time. The writes share no counter row, so any
certification conflict between the nodes (MariaDB error 1213, retried by the driver and counted
in ``engine.driver.retries["conflict"]``) comes from an index the rows have in common.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from quota_ledger import QuotaEngine, QuotaLedgerError


@dataclass(kw_only=True)
class LoadResult:
    seconds: float
    reserves: Counter[str] = field(default_factory=Counter)  # by node URL
    retries: Counter[str] = field(default_factory=Counter)  # by cause, all nodes
    errors: Counter[str] = field(default_factory=Counter)  # by error class, after the retries

    @property
    def conflicts(self) -> int:
        return self.retries["conflict"]

    def summary(self) -> str:
        total = sum(self.reserves.values())
        per_node = ", ".join(str(n) for n in self.reserves.values())
        return (
            f"{total} reserves in {self.seconds:.1f} s ({per_node} by node), "
            f"{self.conflicts} certification conflicts retried, retries {dict(self.retries)}, "
            f"errors {dict(self.errors)}"
        )


def queue_of(node: int, thread: int) -> str:
    return f"root.node{node}_{thread}"


def prepare(urls: list[str], threads: int, timeout: float = 30) -> None:
    """Limits (and so counters) for every writer's queue, set on the first node; returns once
    every node has them (a node that had not would create the counters itself, and conflict)."""
    with QuotaEngine.from_url(urls[0]) as engine:
        for node in range(1, len(urls) + 1):
            for thread in range(threads):
                engine.set_limits(queue_of(node, thread), {"fpga": 10**15})
        expected = engine.limits()
    deadline = time.monotonic() + timeout
    for url in urls[1:]:
        with QuotaEngine.from_url(url) as other:
            while other.limits() != expected:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{url} has not applied the limits after {timeout:.0f} s")
                time.sleep(0.05)


def run(urls: list[str], seconds: float, *, threads: int = 1) -> LoadResult:
    """``threads`` writers per node URL, each reserving on its own queue for ``seconds``."""
    engines = [QuotaEngine.from_url(url) for url in urls]
    result = LoadResult(seconds=seconds)
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def writer(node: int, thread: int) -> None:
        engine, done, failed = engines[node - 1], 0, Counter[str]()
        while time.monotonic() < stop:
            try:
                engine.reserve(queue_of(node, thread), {"fpga": 1})
                done += 1
            except QuotaLedgerError as error:
                failed[type(error).__name__] += 1
        with lock:
            result.reserves[urls[node - 1]] += done
            result.errors.update(failed)

    workers = [
        threading.Thread(target=writer, args=(node, thread))
        for node in range(1, len(urls) + 1)
        for thread in range(threads)
    ]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        for engine in engines:
            result.retries.update(engine.driver.retries)
            engine.close()
    return result
