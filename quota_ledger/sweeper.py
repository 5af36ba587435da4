"""The expiry loop: calls :meth:`QuotaEngine.expire` until told to stop. No SQL here."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from quota_ledger.engine import QuotaEngine
from quota_ledger.errors import DatabaseUnavailable

log = logging.getLogger("quota_ledger.sweeper")


def run(
    engine: QuotaEngine,
    *,
    interval: float,
    batch_size: int,
    stop: threading.Event,
    workers: int = 1,
    max_rate: float | None = None,
    on_round: Callable[[int], None] | None = None,
) -> int:
    """Sweep every ``interval`` seconds until ``stop`` is set; returns the total expired.

    Each round drains the backlog batch by batch (see :meth:`QuotaEngine.expire`), at most
    ``max_rate`` reservations per second; each batch is its own short transaction, so
    stopping at any moment loses nothing.
    """
    total = 0
    while not stop.is_set():
        try:
            expired = engine.expire(batch_size=batch_size, workers=workers, max_rate=max_rate)
        except DatabaseUnavailable as error:
            log.warning("sweep failed, will retry: %s", error)
            stop.wait(interval)
            continue
        total += expired
        if on_round is not None:
            on_round(expired)
        if expired:
            log.info("expired %d reservations", expired)
        stop.wait(interval)
    return total
