"""The sweep's batch loop and its pacer, with a fake clock (no database)."""

from __future__ import annotations

import pytest

from quota_ledger.ledger import batches


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_pacer_waits_until_the_rows_swept_so_far_are_due() -> None:
    t = FakeTime()
    pacer = batches.Pacer(1000.0, clock=t.clock)
    t.now += 0.1  # a batch of 500 took 0.1 s: due at 0.5 s
    pacer.done(500, sleep=t.sleep)
    assert t.slept == [pytest.approx(0.4)]
    t.now += 0.7  # the next one was slow (1.2 s in, 1,000 due at 1.0 s): no pause
    pacer.done(500, sleep=t.sleep)
    assert len(t.slept) == 1
    t.now += 0.1  # 1,500 rows are due at 1.5 s; it is 1.3 s
    pacer.done(500, sleep=t.sleep)
    assert t.slept[-1] == pytest.approx(0.2)


def test_without_a_rate_a_pacer_never_waits() -> None:
    t = FakeTime()
    pacer = batches.Pacer(None, clock=t.clock)
    pacer.done(10**9, sleep=t.sleep)
    assert t.slept == []


def test_the_loop_paces_full_batches_and_stops_at_a_short_one() -> None:
    counts = iter([5, 5, 2, 5])
    paced: list[int] = []

    class Recording(batches.Pacer):
        def done(self, rows: int, sleep: object = None) -> None:
            paced.append(rows)

    total = batches.run(lambda: next(counts), 5, batches.Budget(None), 1, Recording(10.0))
    assert total == 12
    assert paced == [5, 5]  # the short batch ends the sweep: nothing to wait for


def test_the_budget_is_shared_and_spent_once() -> None:
    budget = batches.Budget(3)
    total = batches.run(lambda: 4, 4, budget, workers=2)
    assert total == 12
    assert not budget.take()
