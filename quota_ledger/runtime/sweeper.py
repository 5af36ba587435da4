"""The expiry loop: calls :meth:`QuotaEngine.expire` until told to stop. No SQL here."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from quota_ledger.engine import QuotaEngine
from quota_ledger.ledger import batches
from quota_ledger.model.errors import DatabaseUnavailable, SchemaNotReady

log = logging.getLogger("quota_ledger.sweeper")

#: batches per worker in one round: between rounds the loop checks whether it was told to stop
ROUND_BATCHES = 20


class Health:
    """What the loop tells the service: since when its rounds fail, and the reservations it set
    aside (readiness and the metrics read it; see :class:`~quota_ledger.ledger.batches.SetAside`).

    A reservation that cannot be expired does not fail a round (it is set aside), so a round
    that fails means the sweep as a whole cannot run: the database is down, its schema is not
    ready, or the ledger met an error it does not expect.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.set_aside = batches.SetAside()
        #: rounds that failed since the loop started (each error is in the log)
        self.failed_rounds = 0
        self._clock = clock
        self._failing_since: float | None = None
        self._lock = threading.Lock()

    def succeeded(self) -> None:
        with self._lock:
            self._failing_since = None

    def failed(self) -> None:
        with self._lock:
            self.failed_rounds += 1
            if self._failing_since is None:
                self._failing_since = self._clock()

    def failing_for(self) -> float:
        """Seconds since the first of the rounds that have failed in a row (0: the last round
        succeeded, or none ran yet)."""
        with self._lock:
            return 0.0 if self._failing_since is None else self._clock() - self._failing_since


def run(
    engine: QuotaEngine,
    *,
    interval: float,
    batch_size: int,
    stop: threading.Event,
    workers: int = 1,
    max_rate: float | None = None,
    on_round: Callable[[int], None] | None = None,
    health: Health | None = None,
) -> int:
    """Sweep every ``interval`` seconds until ``stop`` is set; returns the total expired.

    Each round expires up to :data:`ROUND_BATCHES` batches per worker (see
    :meth:`QuotaEngine.expire`), at most ``max_rate`` reservations per second; a full round
    is followed by the next at once, so a backlog is drained without waiting ``interval``
    and a stop is seen within one round. Each batch is its own short transaction, so
    stopping at any moment loses nothing. Reservations set aside stay in ``health`` (a new
    one when None) for the loop's life: no later round tries them again.
    """
    state = health if health is not None else Health()
    total = 0
    round_batches = ROUND_BATCHES * workers
    while not stop.is_set():
        try:
            expired = engine.expire(
                batch_size=batch_size,
                workers=workers,
                max_rate=max_rate,
                max_batches=round_batches,
                set_aside=state.set_aside,
            )
        except (DatabaseUnavailable, SchemaNotReady) as error:
            # An outage or a schema being upgraded must not end the loop: it sweeps again later.
            state.failed()
            log.warning("sweep failed, will retry: %s", error)
            stop.wait(interval)
            continue
        except Exception as error:  # the loop outlives any error; its cause is in the log
            state.failed()
            log.error("sweep failed, will retry: %s", error, exc_info=error)
            stop.wait(interval)
            continue
        state.succeeded()
        total += expired
        if on_round is not None:
            on_round(expired)
        if expired:
            log.info("expired %d reservations", expired)
        if expired < round_batches * batch_size:  # drained: wait for more to run out
            stop.wait(interval)
    return total
