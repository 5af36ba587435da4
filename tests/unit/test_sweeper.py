"""The sweep loop's rounds, with a stand-in engine that counts calls (no database)."""

from __future__ import annotations

import threading
import time
from typing import Any

from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.runtime import sweeper


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


class Failing:
    """expire() that raises ``errors`` in turn, then finds nothing; stops the loop after ``rounds``."""

    def __init__(
        self, errors: list[Exception], stop: threading.Event, rounds: int, health: sweeper.Health
    ) -> None:
        self.errors = errors
        self.stop = stop
        self.rounds = rounds
        self.health = health
        self.calls: list[dict[str, Any]] = []
        self.failing: list[float] = []

    def expire(self, **kwargs: Any) -> int:
        self.calls.append(kwargs)
        self.failing.append(self.health.failing_for())
        if len(self.calls) == self.rounds:
            self.stop.set()
        if self.errors:
            raise self.errors.pop(0)
        return 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 10.0  # each reading is 10 s after the last
        return self.now


def test_a_failing_round_does_not_end_the_loop_and_how_long_it_fails_is_told() -> None:
    stop = threading.Event()
    health = sweeper.Health(clock=Clock())
    errors: list[Exception] = [QuotaLedgerError("database error: OperationalError"), KeyError("x")]
    engine = Failing(errors, stop, rounds=4, health=health)
    sweeper.run(engine, interval=0.001, batch_size=10, stop=stop, health=health)  # type: ignore[arg-type]
    assert len(engine.calls) == 4  # an error of any kind is retried the next round
    assert health.failed_rounds == 2
    assert engine.failing[0] == 0.0
    assert engine.failing[2] > 0  # failing since the first round, read twice since
    assert health.failing_for() == 0.0  # the last rounds succeeded


def test_the_loop_gives_every_round_the_same_memory_of_reservations_set_aside() -> None:
    stop = threading.Event()
    health = sweeper.Health()
    engine = Failing([], stop, rounds=3, health=health)
    sweeper.run(engine, interval=0.001, batch_size=10, stop=stop, health=health)  # type: ignore[arg-type]
    assert {id(call["set_aside"]) for call in engine.calls} == {id(health.set_aside)}
