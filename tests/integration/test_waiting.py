"""Requests that wait for capacity (``reserve(wait=...)``), on every decision path: the line in
the database, its order, grants by whatever frees capacity, timeouts, cancellations and keys."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from ledger_dump import dump
from sqlalchemy import URL, select

from quota_ledger import (
    InvalidRequest,
    OverQuota,
    QuotaEngine,
    ReservationState,
    ReservationStateError,
    WaitTimeout,
)
from quota_ledger.driver.schema import reservations

WAITING = ReservationState.WAITING
PENDING = ReservationState.PENDING

CONFIG = """
partitions:
- name: default
  queues:
  - name: root
    queues:
    - name: team
      resources: {max: {vcore: 10}}
      queues:
      - name: a
      - name: b
"""


@pytest.fixture
def ledger(path_ledger: QuotaEngine) -> QuotaEngine:
    path_ledger.apply_config(CONFIG)
    return path_ledger


def reserved(ledger: QuotaEngine, queue: str = "root.team") -> int:
    return ledger.usage(queue)["vcore"].reserved


def test_a_request_that_does_not_fit_waits_holding_nothing(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "8"})
    waiting = ledger.reserve("root.team.b", {"vcore": "4"}, wait=30, block=False, priority=3)
    assert (waiting.state, waiting.position, waiting.priority) == (WAITING, 1, 3)
    assert waiting.resources == {"vcore": 4000}
    assert reserved(ledger) == 8000
    assert ledger.get(waiting.id).state is WAITING
    with ledger.driver.engine.connect() as conn:
        row = conn.execute(
            select(reservations.c.state, reservations.c.priority, reservations.c.resolved_at).where(
                reservations.c.id == waiting.id
            )
        ).one()
    assert tuple(row) == ("waiting", 3, None)
    assert ledger.audit() == []


def test_a_rollback_grants_the_waiting_request_its_ttl_counted_from_the_grant(ledger: QuotaEngine) -> None:
    holder = ledger.reserve("root.team.a", {"vcore": "8"})
    waiting = ledger.reserve("root.team.b", {"vcore": "4"}, wait=30, block=False, ttl=600)
    time.sleep(0.05)
    ledger.rollback(holder.id)
    granted = ledger.wait_for(waiting.id, 10)
    assert (granted.id, granted.state, granted.position) == (waiting.id, PENDING, None)
    assert granted.created_at >= waiting.created_at
    assert granted.expires_at - granted.created_at == timedelta(seconds=600)
    assert reserved(ledger) == 4000
    assert ledger.commit(granted.id).state is ReservationState.COMMITTED
    assert ledger.audit() == []


def test_a_blocked_caller_is_granted_when_another_thread_frees_capacity(ledger: QuotaEngine) -> None:
    holder = ledger.reserve("root.team.a", {"vcore": "8"})
    timer = threading.Timer(0.3, ledger.rollback, args=(holder.id,))
    timer.start()
    started = time.monotonic()
    try:
        granted = ledger.reserve("root.team.b", {"vcore": "4"}, wait=20)
    finally:
        timer.join()
    assert granted.state is PENDING
    assert 0.25 <= time.monotonic() - started < 10
    assert reserved(ledger) == 4000


def test_a_wait_that_runs_out_raises_wait_timeout_and_leaves_the_line_expired(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "8"})
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.team.b", {"vcore": "4"})
    with pytest.raises(WaitTimeout) as timed_out:
        ledger.reserve("root.team.b", {"vcore": "4"}, wait=0.5)
    assert timed_out.value.violations == refused.value.violations
    ended = ledger.get(timed_out.value.reservation_id)
    assert ended.state is ReservationState.EXPIRED
    assert ended.resolved_at is not None
    assert reserved(ledger) == 8000
    assert ledger.list_reservations(state=WAITING) == []
    assert ledger.audit() == []


def test_higher_priority_is_granted_first_then_arrival(ledger: QuotaEngine) -> None:
    holder = ledger.reserve("root.team.a", {"vcore": "10"})
    low = ledger.reserve("root.team.b", {"vcore": "4"}, wait=30, block=False, priority=0)
    first = ledger.reserve("root.team.b", {"vcore": "4"}, wait=30, block=False, priority=5)
    second = ledger.reserve("root.team.b", {"vcore": "4"}, wait=30, block=False, priority=5)
    assert [ledger.wait_for(r.id, 0.01).position for r in (first, second, low)] == [1, 2, 3]
    ledger.commit(holder.id, {"vcore": "2"})  # frees 8: room for two of the three
    assert ledger.wait_for(first.id, 10).state is PENDING
    assert ledger.wait_for(second.id, 10).state is PENDING
    left = ledger.wait_for(low.id, 0.5)
    assert (left.state, left.position) == (WAITING, 1)
    assert reserved(ledger) == 8000


def test_a_later_request_that_fits_passes_one_that_does_not(ledger: QuotaEngine) -> None:
    holder = ledger.reserve("root.team.a", {"vcore": "9"})
    big = ledger.reserve("root.team.b", {"vcore": "6"}, wait=30, block=False)
    small = ledger.reserve("root.team.b", {"vcore": "2"}, wait=30, block=False)
    ledger.commit(holder.id, {"vcore": "7"})  # frees 2: the small one fits, the big one does not
    assert ledger.wait_for(small.id, 10).state is PENDING
    assert ledger.wait_for(big.id, 0.3).state is WAITING
    # a new request that fits is admitted at once, waiting requests notwithstanding
    assert ledger.reserve("root.team.a", {"vcore": "1"}).state is PENDING


def test_raising_a_limit_grants_what_now_fits(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "10"})
    waiting = ledger.reserve("root.team.b", {"vcore": "3"}, wait=30, block=False)
    ledger.set_limits("root.team", {"vcore": "13"})
    assert ledger.wait_for(waiting.id, 10).state is PENDING
    assert reserved(ledger) == 13000


def test_the_sweep_grants_what_expiries_free_and_ends_waits_that_ran_out(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "8"}, ttl=0.2)
    brief = ledger.reserve("root.team.b", {"vcore": "9"}, wait=0.2, block=False)
    waiting = ledger.reserve("root.team.b", {"vcore": "4"}, wait=60, block=False)
    time.sleep(0.5)
    ledger.expire()
    assert ledger.get(waiting.id).state is PENDING
    assert ledger.get(brief.id).state is ReservationState.EXPIRED
    assert reserved(ledger) == 4000
    assert ledger.audit() == []


def test_a_release_grants_what_it_frees(ledger: QuotaEngine) -> None:
    holder = ledger.commit(ledger.reserve("root.team.a", {"vcore": "10"}).id)
    waiting = ledger.reserve("root.team.b", {"vcore": "5"}, wait=30, block=False)
    ledger.release_reservation(holder.id)
    assert ledger.wait_for(waiting.id, 10).state is PENDING


def test_a_waiting_request_is_cancelled_by_rollback_and_cannot_be_committed(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "10"})
    waiting = ledger.reserve("root.team.b", {"vcore": "1"}, wait=30, block=False)
    with pytest.raises(ReservationStateError):
        ledger.commit(waiting.id)
    cancelled = ledger.rollback(waiting.id)
    assert cancelled.state is ReservationState.ROLLED_BACK
    assert ledger.rollback(waiting.id).state is ReservationState.ROLLED_BACK
    assert reserved(ledger) == 10000
    assert ledger.audit() == []


def test_a_key_queues_once_and_returns_the_same_request(ledger: QuotaEngine) -> None:
    holder = ledger.reserve("root.team.a", {"vcore": "10"})
    first = ledger.reserve("root.team.b", {"vcore": "2"}, wait=30, block=False, key="job-1")
    again = ledger.reserve("root.team.b", {"vcore": "2"}, wait=30, block=False, key="job-1")
    assert (again.id, again.state) == (first.id, WAITING)
    assert len(ledger.list_reservations(state=WAITING)) == 1
    ledger.rollback(holder.id)
    assert ledger.wait_for(first.id, 10).state is PENDING
    retried = ledger.reserve("root.team.b", {"vcore": "2"}, wait=30, key="job-1")
    assert (retried.id, retried.state) == (first.id, PENDING)
    assert reserved(ledger) == 2000


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"wait": 0}, "wait"),
        ({"wait": -1}, "wait"),
        ({"wait": float("nan")}, "wait"),
        ({"wait": "10"}, "wait"),
        ({"wait": True}, "wait"),
        ({"priority": 1}, "priority"),
        ({"wait": 5, "priority": 2**31}, "priority"),
        ({"wait": 5, "priority": 1.5}, "priority"),
        ({"wait": 5, "block": "no"}, "block"),
    ],
)
def test_bad_wait_arguments_are_refused_and_change_nothing(
    ledger: QuotaEngine, arguments: dict[str, object], field: str
) -> None:
    ledger.reserve("root.team.a", {"vcore": "10"})
    before = dump(ledger)
    with pytest.raises(InvalidRequest) as refused:
        ledger.reserve("root.team.b", {"vcore": "1"}, **arguments)  # type: ignore[arg-type]
    assert refused.value.field == field
    assert dump(ledger) == before


def test_capacity_freed_by_another_engine_is_granted_within_the_poll_interval(
    ledger: QuotaEngine, path_url: URL
) -> None:
    holder = ledger.reserve("root.team.a", {"vcore": "10"})
    other = QuotaEngine.from_url(path_url)
    try:
        waiter = QuotaEngine.from_url(path_url, wait_poll_interval=0.1)
        try:
            timer = threading.Timer(0.3, other.rollback, args=(holder.id,))
            timer.start()
            granted = waiter.reserve("root.team.b", {"vcore": "4"}, wait=20)
            timer.join()
        finally:
            waiter.close()
    finally:
        other.close()
    assert granted.state is PENDING
