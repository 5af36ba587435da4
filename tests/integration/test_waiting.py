"""Requests that wait for capacity (``reserve(wait=...)``), on every decision path: the line in
the database, its order, grants by whatever frees capacity, timeouts, cancellations and keys."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
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
from quota_ledger.driver import line_notices
from quota_ledger.driver.schema import reservation_items, reservations
from quota_ledger.ledger import waiting

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


STRICT = """
partitions:
- name: default
  queues:
  - name: root
    queues:
    - name: team
      properties: {queueing.policy: StrictFIFO}
      resources: {max: {vcore: 10, memory: 10Gi}}
      queues:
      - name: a
        resources: {max: {vcore: 6}}
      - name: b
      - name: free
        properties: {queueing.policy: BestEffortFIFO}
        resources: {max: {vcore: 2}}
    - name: other
"""


@pytest.fixture
def strict(path_ledger: QuotaEngine) -> QuotaEngine:
    path_ledger.apply_config(STRICT)
    return path_ledger


def test_under_strict_fifo_a_later_request_that_fits_does_not_pass_a_waiting_one(strict: QuotaEngine) -> None:
    holder = strict.reserve("root.team.b", {"vcore": "8"})
    big = strict.reserve("root.team.b", {"vcore": "5"}, wait=30, block=False)
    with pytest.raises(OverQuota) as refused:
        strict.reserve("root.team.b", {"vcore": "1"})  # fits the limit, but the line is strict
    (violation,) = refused.value.violations
    assert (violation.scope, violation.resource, violation.requested) == ("root.team", "vcore", 6000)
    explained = strict.explain("root.team.b", {"vcore": "1"}, wait=5)
    assert (explained.admitted, explained.ahead) == (False, 1)
    small = strict.reserve("root.team.b", {"vcore": "1"}, wait=30, block=False)
    assert (small.state, small.position) == (WAITING, 2)
    strict.commit(holder.id, {"vcore": "6"})  # frees 2: not the big one, so not the small one behind it
    assert strict.wait_for(small.id, 0.5).state is WAITING
    strict.set_limits("root.team", {"vcore": "16"})  # room for both: the big one first
    assert strict.wait_for(big.id, 10).state is PENDING
    assert strict.wait_for(small.id, 10).state is PENDING
    assert reserved(strict) == 6000
    assert strict.audit() == []


def test_strict_fifo_blocks_only_requests_for_what_the_line_waits_for(strict: QuotaEngine) -> None:
    strict.reserve("root.team.b", {"vcore": "8"})
    strict.reserve("root.team.b", {"vcore": "5"}, wait=30, block=False)
    # no vcore asked: nothing to wait for behind it
    assert strict.reserve("root.team.b", {"memory": "1Gi"}).state is PENDING
    # outside root.team: another line
    assert strict.reserve("root.other", {"vcore": "100"}).state is PENDING
    # a higher priority is ahead of it in the line
    assert strict.reserve("root.team.b", {"vcore": "1"}, wait=5, priority=1).state is PENDING


def test_a_queue_may_set_best_effort_below_a_strict_parent(strict: QuotaEngine) -> None:
    strict.reserve("root.team.free", {"vcore": "2"})
    waiting = strict.reserve("root.team.free", {"vcore": "2"}, wait=30, block=False)
    assert waiting.state is WAITING  # blocked by root.team.free's own limit: a best-effort line
    assert strict.reserve("root.team.b", {"vcore": "1"}).state is PENDING
    strict.reserve("root.team.a", {"vcore": "6"})
    inherited = strict.reserve("root.team.a", {"vcore": "1"}, wait=30, block=False)
    assert inherited.state is WAITING  # root.team.a inherits StrictFIFO from root.team
    with pytest.raises(OverQuota):
        strict.reserve("root.team.a", {"vcore": "1"})


def test_an_unknown_queueing_policy_is_refused(ledger: QuotaEngine) -> None:
    from quota_ledger import ConfigError

    version = ledger.config_version()
    with pytest.raises(ConfigError, match=r"queueing\.policy 'Fifo' is not known"):
        ledger.apply_config(STRICT.replace("StrictFIFO", "Fifo"))
    assert ledger.config_version() == version


def test_the_line_is_listed_in_order_with_positions(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "10"})
    first = ledger.reserve("root.team.a", {"vcore": "1"}, wait=30, block=False)
    urgent = ledger.reserve("root.team.b", {"vcore": "2"}, wait=30, block=False, priority=9)
    last = ledger.reserve("root.team.b", {"vcore": "3"}, wait=30, block=False)
    line = ledger.waiting()
    assert [(r.id, r.position, r.resources) for r in line] == [
        (urgent.id, 1, {"vcore": 2000}),
        (first.id, 2, {"vcore": 1000}),
        (last.id, 3, {"vcore": 3000}),
    ]
    assert [r.id for r in ledger.waiting("root.team.b")] == [urgent.id, last.id]
    assert ledger.explain("root.team.a", {"vcore": "1"}, wait=5, priority=9).ahead == 1
    assert ledger.explain("root.team.a", {"vcore": "1"}).ahead is None


def test_on_postgresql_a_grant_made_elsewhere_wakes_the_waiter_by_notice(postgres_url: URL) -> None:
    """The waiter polls every 30 s only: its wake-up within seconds is the notice's."""
    with (
        QuotaEngine.from_url(postgres_url) as other,
        QuotaEngine.from_url(postgres_url, wait_poll_interval=30) as waiter,
    ):
        other.apply_config(CONFIG)
        holder = other.reserve("root.team.a", {"vcore": "10"})
        timer = threading.Timer(1.0, other.rollback, args=(holder.id,))
        timer.start()
        started = time.monotonic()
        granted = waiter.reserve("root.team.b", {"vcore": "4"}, wait=60)
        timer.join()
    assert granted.state is PENDING
    assert time.monotonic() - started < 10


def test_the_audit_finds_and_mends_a_waiting_row_that_no_request_can_be(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "10"})
    waiting = ledger.reserve("root.team.b", {"vcore": "2"}, wait=30, block=False)
    assert ledger.audit() == []
    with ledger.driver.engine.begin() as conn:
        conn.execute(
            reservation_items.update()
            .where(reservation_items.c.reservation_id == waiting.id)
            .values(committed=1000)
        )
    (found,) = ledger.audit()
    assert (found.scope_type, found.scope, found.name, found.fixed) == (
        "waiting",
        "root.team.b",
        waiting.id,
        False,
    )
    (fixed,) = ledger.audit(fix=True)
    assert (fixed.name, fixed.fixed) == (waiting.id, True)
    assert ledger.get(waiting.id).state is ReservationState.ROLLED_BACK
    assert ledger.audit() == []


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "trainer", "namespace": "team", "uid": "pod-1"},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
}


def test_a_running_pod_is_charged_whatever_waits_in_a_strict_line(strict: QuotaEngine) -> None:
    strict.reserve("root.team.b", {"vcore": "8"})
    strict.reserve("root.team.b", {"vcore": "5"}, wait=30, block=False)
    charged = strict.charge_pod(POD)
    assert charged.reservation.state is ReservationState.COMMITTED
    assert strict.usage("root.team")["vcore"].in_use == 1000


def test_charging_a_pod_ends_the_wait_of_its_own_request(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "10"})
    waiting = ledger.reserve("root.team", {"vcore": "1"}, wait=30, block=False, key="pod-1")
    charged = ledger.charge_pod(POD)
    assert charged.reservation.state is ReservationState.COMMITTED
    assert ledger.get(waiting.id).state is ReservationState.ROLLED_BACK
    assert ledger.waiting() == []
    assert ledger.audit() == []


def test_a_wait_that_ran_out_blocks_no_strict_line(strict: QuotaEngine) -> None:
    strict.reserve("root.team.b", {"vcore": "8"})
    strict.reserve("root.team.b", {"vcore": "5"}, wait=0.2, block=False)
    time.sleep(0.4)  # no sweep: the row still says waiting, but its wait ran out
    assert strict.reserve("root.team.b", {"vcore": "1"}).state is PENDING


def test_a_request_that_joins_after_a_freeing_call_is_passed_over_by_the_next(path_url: URL) -> None:
    """The engine polls every 30 s only: the grant comes from its next rollback's pass."""
    with QuotaEngine.from_url(path_url, wait_poll_interval=30) as engine:
        engine.apply_config(CONFIG)
        first = engine.reserve("root.team.a", {"vcore": "5"})
        second = engine.reserve("root.team.a", {"vcore": "5"})
        engine.rollback(first.id)  # nothing waits yet: the engine notes that the line is empty
        engine.reserve("root.team.b", {"vcore": "5"})
        waiting = engine.reserve("root.team.b", {"vcore": "4"}, wait=60, block=False)
        assert waiting.state is WAITING
        engine.rollback(second.id)
        deadline = time.monotonic() + 10
        while engine.get(waiting.id).state is WAITING and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.get(waiting.id).state is PENDING


def test_a_pass_grants_every_request_that_fits_in_a_line_longer_than_it_reads_first(
    ledger: QuotaEngine,
) -> None:
    """A pass reads the first requests of a line, then the rest when it gets through them: the
    sweep's one pass grants them all (no blocked caller here polls, nothing else kicks)."""
    ledger.reserve("root.team.a", {"vcore": "10"}, ttl=0.2)
    count = waiting.PASS_FIRST + 4
    line = [ledger.reserve("root.team.b", {"vcore": "500m"}, wait=60, block=False) for _ in range(count)]
    assert all(r.state is WAITING for r in line)
    time.sleep(0.5)
    ledger.expire()
    assert [ledger.get(r.id).state for r in line] == [PENDING] * count
    assert reserved(ledger) == 10_000
    assert ledger.audit() == []


def test_on_postgresql_a_notice_names_the_request_that_left_its_line(postgres_url: URL) -> None:
    with (
        QuotaEngine.from_url(postgres_url) as ledger,
        psycopg.connect(
            postgres_url.render_as_string(hide_password=False).replace("+psycopg", ""), autocommit=True
        ) as listener,
    ):
        ledger.apply_config(CONFIG)
        ledger.reserve("root.team.a", {"vcore": "10"})
        listener.execute(f"LISTEN {line_notices.CHANNEL}")
        queued = ledger.reserve("root.team.b", {"vcore": "4"}, wait=60, block=False)
        ledger.rollback(queued.id)
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert payloads == [f"default\t{queued.id}"]
