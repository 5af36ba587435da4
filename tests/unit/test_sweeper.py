"""The sweep loop's rounds, with a stand-in engine that counts calls (no database)."""

from __future__ import annotations

import threading
import time
from typing import Any

from quota_ledger.service import sweeper


class Backlog:
    """expire() over a backlog of ``rows``: what the real one returns for its arguments."""

    def __init__(self, rows: int, stop: threading.Event | None = None, stop_after: int = 0) -> None:
        self.rows = rows
        self.calls: list[dict[str, Any]] = []
        self.stop = stop
        self.stop_after = stop_after

    def expire(self, **kwargs: Any) -> int:
        self.calls.append(kwargs)
        cap: int = kwargs["max_batches"] * kwargs["batch_size"]
        done = min(self.rows, cap)
        self.rows -= done
        if self.stop is not None and len(self.calls) == self.stop_after:
            self.stop.set()
        return done


def test_a_backlog_is_drained_in_rounds_without_waiting_the_interval() -> None:
    stop = threading.Event()
    rows = 3 * sweeper.ROUND_BATCHES * 10 + 7  # three full rounds of 10-row batches, then 7
    engine = Backlog(rows, stop, stop_after=4)
    started = time.monotonic()
    total = sweeper.run(engine, interval=60.0, batch_size=10, stop=stop, max_rate=500.0)  # type: ignore[arg-type]
    assert total == rows
    assert time.monotonic() - started < 5  # no 60 s wait between the full rounds
    assert len(engine.calls) == 4
    assert {call["max_rate"] for call in engine.calls} == {500.0}
    assert {call["max_batches"] for call in engine.calls} == {sweeper.ROUND_BATCHES}


def test_a_stop_is_seen_after_the_round_it_came_in() -> None:
    stop = threading.Event()
    engine = Backlog(10**9, stop, stop_after=2)  # a backlog that never ends
    total = sweeper.run(engine, interval=60.0, batch_size=10, workers=2, stop=stop)  # type: ignore[arg-type]
    assert len(engine.calls) == 2
    assert total == 2 * 2 * sweeper.ROUND_BATCHES * 10  # two rounds of two workers' batches
