"""Usage history rebuilt from the journal and the reservations, on every backend.

The ledger stamps rows with the database clock, so the tests move the rows of each step of a
story back in time (the same columns the ledger writes) and then read the history as of now.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import text, update
from sqlalchemy.engine import URL

from quota_ledger import InvalidRequest, QuotaEngine
from quota_ledger.driver import history as statements
from quota_ledger.driver.schema import quota_journal, reservations
from quota_ledger.model.history import UsageHistory
from quota_ledger.runtime import overview

CORE = 1000  # vcore is counted in milli-cores


def _now(engine: QuotaEngine) -> datetime:
    return engine.driver.run(lambda tx: tx.db_now())


def _move(
    engine: QuotaEngine, reservation_id: str, *, made: datetime, resolved: datetime | None = None
) -> None:
    """Stamp a reservation (and its commit in the journal) as made and resolved at these times."""
    with engine.driver.engine.begin() as conn:
        values = {"created_at": made} | ({"resolved_at": resolved} if resolved is not None else {})
        conn.execute(update(reservations).where(reservations.c.id == reservation_id).values(**values))
        if resolved is not None:
            conn.execute(
                update(quota_journal)
                .where(quota_journal.c.reservation_id == reservation_id)
                .values(created_at=resolved)
            )


def _move_releases(engine: QuotaEngine, queue: str, at: datetime) -> None:
    with engine.driver.engine.begin() as conn:
        conn.execute(
            update(quota_journal)
            .where(quota_journal.c.queue == queue, quota_journal.c.kind == "release")
            .values(created_at=at)
        )


def _at(found: UsageHistory, minutes_ago: int) -> tuple[int, int]:
    """(in use, reserved) vcore in cores at the point ``minutes_ago`` before the end."""
    point = found.points[len(found.points) - 1 - minutes_ago]
    assert abs((found.end - point.time) - timedelta(minutes=minutes_ago)) < timedelta(seconds=1)
    return point.in_use["vcore"] // CORE, point.reserved["vcore"] // CORE


def test_history_replays_reservations_commits_rollbacks_and_releases(ledger: QuotaEngine) -> None:
    ledger.set_limits("root.a", {"vcore": 20})
    before = ledger.reserve("root.a.x", {"vcore": "3"})  # made before the window, still pending
    early = ledger.reserve("root.a.y", {"vcore": "5"})  # made before the window, committed in it
    ledger.commit(early.id)
    first = ledger.reserve("root.a.x", {"vcore": "4"})
    ledger.commit(first.id)
    pending = ledger.reserve("root.a.y", {"vcore": "2"})
    undone = ledger.reserve("root.a.y", {"vcore": "1"})
    ledger.rollback(undone.id)
    ledger.release("root.a.x", {"vcore": "1"})
    elsewhere = ledger.reserve("root.b", {"vcore": "7"})  # outside root.a: never counted
    ledger.commit(elsewhere.id)

    now = _now(ledger)

    def ago(minutes: float) -> datetime:
        return now - timedelta(minutes=minutes)

    _move(ledger, before.id, made=ago(120))
    _move(ledger, early.id, made=ago(120), resolved=ago(15.5))
    _move(ledger, first.id, made=ago(50.5), resolved=ago(40.5))
    _move(ledger, pending.id, made=ago(30.5))
    _move(ledger, undone.id, made=ago(20.5), resolved=ago(10.5))
    _move_releases(ledger, "root.a.x", ago(5.5))
    _move(ledger, elsewhere.id, made=ago(25.5), resolved=ago(25.5))

    found = overview.usage_history(ledger, "root.a", window="1h")

    assert found.window.step == 60
    assert len(found.points) == 61
    assert found.limits == {"vcore": 20 * CORE}
    assert found.resources == ["vcore"]
    expected = {60: (0, 8), 51: (0, 8), 50: (0, 12), 40: (4, 8), 30: (4, 10), 20: (4, 11)}
    expected |= {15: (9, 6), 10: (9, 5), 5: (8, 5), 0: (8, 5)}
    assert {minutes: _at(found, minutes) for minutes in expected} == expected
    now_usage = ledger.usage("root.a")["vcore"]
    assert (found.points[-1].in_use["vcore"], found.points[-1].reserved["vcore"]) == (
        now_usage.in_use,
        now_usage.reserved,
    )
    whole = overview.usage_history(ledger, "root", window="1h")
    assert (_at(whole, 30), _at(whole, 20)) == ((4, 10), (11, 11))


def test_a_quiet_queue_has_a_flat_history_of_its_usage(ledger: QuotaEngine) -> None:
    ledger.set_limits("root.idle", {"vcore": 4, "memory": "8Gi"})
    held = ledger.reserve("root.idle", {"memory": "1Gi"})
    _move(ledger, held.id, made=_now(ledger) - timedelta(days=3))

    found = overview.usage_history(ledger, "root.idle", window="1d")

    assert found.window.step == 900
    assert len(found.points) == 97
    assert found.end - found.start == timedelta(days=1)
    assert {p.reserved["memory"] for p in found.points} == {2**30}
    assert {p.in_use["vcore"] for p in found.points} == {0}


def test_history_of_a_queue_without_rows_is_all_zero(ledger: QuotaEngine) -> None:
    found = overview.usage_history(ledger, "root.nothing", window="15m")
    assert len(found.points) == 61
    assert found.limits == {}
    assert found.resources == []


@pytest.mark.parametrize(
    ("queue", "window", "field"),
    [("root.a", "2h", "window"), ("root.a", "", "window"), ("a.b", "1h", "queue")],
)
def test_history_refuses_what_it_cannot_answer(
    ledger: QuotaEngine, queue: str, window: str, field: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        overview.usage_history(ledger, queue, window=window)
    assert refused.value.field == field


def test_history_statements_read_their_window_through_an_index(db_url: URL) -> None:
    """EXPLAIN each statement (sequential scans disabled where the engine allows): an index."""
    with QuotaEngine.from_url(db_url) as engine, engine.driver.engine.connect() as conn:
        backend = engine.driver.backend
        params = {"p": "default", "q": "root.a", "lo": "root.a.", "hi": "root.a/", "step": 60}
        params["since"] = datetime(2026, 1, 1)
        pending = (
            "ix_reservations_partition_queue_state_expires_at",
            "ix_reservations_partition_state_expires_at",
        )
        expected = {
            "_JOURNAL_STEPS": ("ix_quota_journal_partition_created_at",),
            "_RESOLVED": ("ix_reservations_partition_resolved_at",),
            "_MADE_RESOLVED": ("ix_reservations_partition_resolved_at",),
            "_MADE_PENDING": pending,  # either pending index: both hold pending rows only
        }
        if backend == "postgresql":
            conn.execute(text("SET enable_seqscan = off"))
        for name, indexes in expected.items():
            compiled = getattr(statements, name).compile(conn)
            prefix = "EXPLAIN QUERY PLAN " if backend == "sqlite" else "EXPLAIN "
            rows = conn.exec_driver_sql(prefix + str(compiled), _positional(compiled, params, backend))
            plan = "\n".join(" ".join(str(v) for v in row) for row in rows)
            assert any(index in plan for index in indexes), f"{name} on {backend}:\n{plan}"


def _positional(compiled: object, params: dict[str, object], backend: str) -> object:
    names = compiled.positiontup  # type: ignore[attr-defined]
    if backend == "sqlite":
        return tuple(params[n] if n != "since" else str(params[n]) for n in names)
    return params
