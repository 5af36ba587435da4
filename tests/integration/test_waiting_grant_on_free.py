"""A freeing call that grants: on PostgreSQL, a rollback or a release grants the first request of
its partition's line in its own transaction when it now fits; and a pass skips what a grant
just filled the room of, on every decision path."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import URL
from test_waiting import CONFIG

from quota_ledger import QuotaEngine, ReservationState
from quota_ledger.driver import dialect
from quota_ledger.ledger import waiting

WAITING = ReservationState.WAITING
PENDING = ReservationState.PENDING


@pytest.fixture
def engine(postgres_url: URL) -> Iterator[QuotaEngine]:
    """An engine without batching that polls every 30 s only: a grant within a test is made by
    a freeing call or a pass it kicked."""
    with QuotaEngine.from_url(postgres_url, wait_poll_interval=30) as engine:
        engine.apply_config(CONFIG)
        yield engine


def _connect(url: URL) -> psycopg.Connection[Any]:
    return psycopg.connect(url.render_as_string(hide_password=False).replace("+psycopg", ""))


def _eventually(engine: QuotaEngine, reservation_id: str, state: ReservationState) -> bool:
    deadline = time.monotonic() + 10
    while engine.get(reservation_id).state is not state:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_rollback_grants_the_first_waiting_request_in_its_own_transaction(engine: QuotaEngine) -> None:
    holder = engine.reserve("root.team.a", {"vcore": "8"})
    queued = engine.reserve("root.team.b", {"vcore": "4"}, wait=60, block=False)
    assert queued.state is WAITING
    engine.rollback(holder.id)
    # Committed with the rollback: granted when the call returns, not by a pass after it.
    assert engine.get(queued.id).state is PENDING
    assert engine.granter.stats.grants == {"rollback": 1}
    assert engine.usage("root.team")["vcore"].reserved == 4000
    assert engine.audit() == []


def test_a_release_grants_the_first_waiting_request_in_its_own_transaction(engine: QuotaEngine) -> None:
    holder = engine.reserve("root.team.a", {"vcore": "8"})
    engine.commit(holder.id)
    queued = engine.reserve("root.team.b", {"vcore": "4"}, wait=60, block=False)
    engine.release_reservation(holder.id)
    assert engine.get(queued.id).state is PENDING
    assert engine.granter.stats.grants == {"release": 1}
    assert engine.audit() == []


def test_a_blocked_caller_of_the_same_engine_is_woken_by_the_freeing_call(engine: QuotaEngine) -> None:
    holder = engine.reserve("root.team.a", {"vcore": "10"})
    granted: list[Any] = []
    caller = threading.Thread(
        target=lambda: granted.append(engine.reserve("root.team.b", {"vcore": "4"}, wait=60))
    )
    caller.start()
    while not engine.waiting("root.team"):
        time.sleep(0.01)
    engine.rollback(holder.id)
    caller.join(timeout=10)
    assert [r.state for r in granted] == [PENDING]


def test_a_first_request_another_transaction_holds_is_left_to_that_one(
    engine: QuotaEngine, postgres_url: URL
) -> None:
    """The freeing call does not wait for the row of the line's first request: whoever holds it
    decides it, and a pass the freeing call kicked grants it once it is free."""
    holder = engine.reserve("root.team.a", {"vcore": "8"})
    queued = engine.reserve("root.team.b", {"vcore": "4"}, wait=60, block=False)
    with _connect(postgres_url) as other:
        other.execute("SELECT 1 FROM reservations WHERE id = %s FOR UPDATE", (queued.id,))
        started = time.monotonic()
        engine.rollback(holder.id)
        assert time.monotonic() - started < 2
        assert engine.usage("root.team")["vcore"].reserved == 0
        assert engine.get(queued.id).state is WAITING
    assert _eventually(engine, queued.id, PENDING)
    assert engine.granter.stats.grants == {"rollback": 1}
    assert engine.audit() == []


def test_a_grant_that_would_wait_for_a_lock_gives_way_and_the_freeing_call_succeeds(
    engine: QuotaEngine, postgres_url: URL
) -> None:
    """A limit change holds the partition lock: the grant in the rollback's transaction would
    wait for it after its counters (out of the lock order), so its wait is bounded, the attempt
    is run again without it, and the rollback commits; the pass grants once the lock is free."""
    holder = engine.reserve("root.team.a", {"vcore": "8"})
    queued = engine.reserve("root.team.b", {"vcore": "4"}, wait=60, block=False)
    with _connect(postgres_url) as other:
        other.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)",
            (dialect.ADVISORY_NAMESPACE, dialect.advisory_key("default")),
        )
        started = time.monotonic()
        engine.rollback(holder.id)
        assert time.monotonic() - started < 5
        assert engine.get(holder.id).state is ReservationState.ROLLED_BACK
        assert engine.get(queued.id).state is WAITING
    assert _eventually(engine, queued.id, PENDING)
    assert engine.usage("root.team")["vcore"].reserved == 4000
    assert engine.audit() == []


def test_a_strict_line_is_granted_by_a_pass_not_by_the_freeing_call(engine: QuotaEngine) -> None:
    engine.apply_config(
        CONFIG.replace(
            "      resources:", "      properties: {queueing.policy: StrictFIFO}\n      resources:"
        )
    )
    holder = engine.reserve("root.team.a", {"vcore": "8"})
    queued = engine.reserve("root.team.b", {"vcore": "4"}, wait=60, block=False)
    calls: list[str] = []
    original = waiting.grant_head

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append("grant_head")
        return original(*args, **kwargs)

    waiting.grant_head = spy  # type: ignore[assignment]
    try:
        engine.rollback(holder.id)
    finally:
        waiting.grant_head = original  # type: ignore[assignment]
    assert calls == []
    assert _eventually(engine, queued.id, PENDING)


def test_a_pass_skips_what_asks_no_less_than_a_grant_that_filled_the_room(
    path_ledger: QuotaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests of one unit wait, and one unit frees: the first is granted, and the second
    is not tried, since the rule said the same request again would not fit (no refusal is
    spent on it). On PostgreSQL without batching the rollback grants the first itself."""
    path_ledger.apply_config(CONFIG)
    holders = [path_ledger.reserve("root.team.a", {"vcore": "5"}) for _ in range(2)]
    first = path_ledger.reserve("root.team.b", {"vcore": "5"}, wait=60, block=False)
    second = path_ledger.reserve("root.team.b", {"vcore": "5"}, wait=60, block=False)
    time.sleep(0.5)  # the pass the second one's join kicked is over
    tried: list[str] = []
    original = path_ledger.paths.grant

    def spy(each: Any) -> Any:  # (what a pass tries, by the function or by the rule)
        tried.append(each.id)
        return original(each)

    monkeypatch.setattr(path_ledger.paths, "grant", spy)
    path_ledger.rollback(holders[0].id)
    assert _eventually(path_ledger, first.id, PENDING)
    path_ledger.grant_waiting()  # one more pass, now: it tries the second, refused
    assert path_ledger.get(second.id).state is WAITING
    assert second.id not in tried[:-1]
    assert tried[-1] == second.id
    assert path_ledger.audit() == []


def test_a_grant_that_fails_its_transaction_leaves_the_freeing_call_to_succeed_alone(
    engine: QuotaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database error met by the grant (here: a statement the server refuses) fails the
    freeing call's transaction: the freeing runs again alone, and a pass grants."""
    holder = engine.reserve("root.team.a", {"vcore": "8"})
    queued = engine.reserve("root.team.b", {"vcore": "4"}, wait=60, block=False)
    original = waiting.grant_head

    def failing(tx: Any, *args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(waiting, "grant_head", original)  # once
        tx.conn.exec_driver_sql("SELECT no_such_column FROM reservations")
        return None

    monkeypatch.setattr(waiting, "grant_head", failing)
    assert engine.rollback(holder.id).state is ReservationState.ROLLED_BACK
    assert _eventually(engine, queued.id, PENDING)
    assert engine.usage("root.team")["vcore"].reserved == 4000
    assert engine.audit() == []


# -- a pass decides by one call on PostgreSQL ------------------------------------------------------
def _rule_grants(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids the rule's grant (:func:`waiting.grant`) decides from now on."""
    decided: list[str] = []
    original = waiting.grant

    def spy(tx: Any, rules: Any, bounds: Any, reservation_id: str) -> Any:
        decided.append(reservation_id)
        return original(tx, rules, bounds, reservation_id)

    monkeypatch.setattr(waiting, "grant", spy)
    return decided


def test_a_pass_grants_by_the_function_without_the_rules_path(
    engine: QuotaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capacity freed by a raised limit: the pass that follows grants the waiting request in one
    call of the function, never by the rule's path."""
    engine.set_limits("root.team.b", {"vcore": 4})
    engine.reserve("root.team.b", {"vcore": "4"})
    queued = engine.reserve("root.team.b", {"vcore": "3"}, wait=60, block=False)
    decided = _rule_grants(monkeypatch)
    engine.set_limits("root.team.b", {"vcore": 7})
    assert _eventually(engine, queued.id, PENDING)
    assert decided == []
    assert engine.granter.stats.grants == {"limits": 1}
    assert engine.usage("root.team.b")["vcore"].reserved == 7000
    assert engine.audit() == []


def test_a_pass_leaves_a_request_the_function_finds_over_a_limit_waiting(
    engine: QuotaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit raised, but not enough: the function finds the request still over it, and the
    pass neither grants it nor asks the rule again; nothing is written."""
    engine.set_limits("root.team.b", {"vcore": 4})
    engine.reserve("root.team.b", {"vcore": "4"})
    queued = engine.reserve("root.team.b", {"vcore": "3"}, wait=60, block=False)
    decided = _rule_grants(monkeypatch)
    before = engine.usage("root.team.b")["vcore"]
    assert engine.grant_waiting() == []
    engine.set_limits("root.team.b", {"vcore": 6})
    assert engine.grant_waiting() == []
    assert decided == []
    assert engine.get(queued.id).state is WAITING
    assert engine.usage("root.team.b")["vcore"].reserved == before.reserved
    engine.set_limits("root.team.b", {"vcore": 7})
    assert _eventually(engine, queued.id, PENDING)  # (by the pass the raised limit kicked)
    assert decided == []
    assert engine.audit() == []


def test_a_strict_line_is_granted_by_the_rules_path(
    engine: QuotaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The function knows nothing of strict lines: a pass over a StrictFIFO partition's line
    decides by the rule, which reads them."""
    engine.apply_config(
        CONFIG.replace(
            "      resources:", "      properties: {queueing.policy: StrictFIFO}\n      resources:"
        )
    )
    holder = engine.reserve("root.team.a", {"vcore": "8"})
    queued = engine.reserve("root.team.b", {"vcore": "4"}, wait=60, block=False)
    decided = _rule_grants(monkeypatch)
    engine.rollback(holder.id)
    assert _eventually(engine, queued.id, PENDING)
    assert queued.id in decided
