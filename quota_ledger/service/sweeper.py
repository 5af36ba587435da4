"""The expiry loop: calls :meth:`QuotaEngine.expire` until told to stop. No SQL here."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from quota_ledger.engine import QuotaEngine
from quota_ledger.model.errors import QuotaLedgerError

log = logging.getLogger("quota_ledger.sweeper")

#: batches per worker in one round: between rounds the loop checks whether it was told to stop
ROUND_BATCHES = 20


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

    Each round expires up to :data:`ROUND_BATCHES` batches per worker (see
    :meth:`QuotaEngine.expire`), at most ``max_rate`` reservations per second; a full round
    is followed by the next at once, so a backlog is drained without waiting ``interval``
    and a stop is seen within one round. Each batch is its own short transaction, so
    stopping at any moment loses nothing.
    """
    total = 0
    round_batches = ROUND_BATCHES * workers
    while not stop.is_set():
        try:
            expired = engine.expire(
                batch_size=batch_size, workers=workers, max_rate=max_rate, max_batches=round_batches
            )
        except QuotaLedgerError as error:
            # An outage or a schema being upgraded must not end the loop: it sweeps again later.
            log.warning("sweep failed, will retry: %s", error)
            stop.wait(interval)
            continue
        total += expired
        if on_round is not None:
            on_round(expired)
        if expired:
            log.info("expired %d reservations", expired)
        if expired < round_batches * batch_size:  # drained: wait for more to run out
            stop.wait(interval)
    return total
