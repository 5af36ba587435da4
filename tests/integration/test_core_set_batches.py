"""Group commit on MariaDB and SQLite decides a batch's plain reserves of a partition and its
whole commits as sets (:mod:`quota_ledger.ledger.reserve_set`, :mod:`.resolve_set`): the rows
they leave are those the general path leaves deciding the same requests one after another,
with a few statements for the whole set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sql_rows import Statements
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from quota_ledger import (
    CounterOverflow,
    IdempotencyConflict,
    OverQuota,
    QuotaEngine,
    ReservationNotFound,
    ReservationState,
    ReservationStateError,
)
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger.group_commit import GroupCommit
from quota_ledger.model.values import Reservation

ZERO_ID = "00000000-0000-0000-0000-000000000000"
TWINS = ("set", "alone")


@pytest.fixture
def batched(core_db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(core_db_url, batching=True, pool_size=4)
    yield engine
    engine.close()


@pytest.fixture
def unbatched(core_db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(core_db_url)
    yield engine
    engine.close()


def _rows(url: URL, partition: str) -> dict[str, list[tuple[Any, ...]]]:
    """What a partition's rows hold, without ids, times and hashes (which name the partition)."""
    queries = {
        "reservations": 'SELECT queue, state, "key", user_name, application, priority_class, kube,'
        ' resolved_at IS NULL FROM reservations WHERE "partition" = :p',
        "items": "SELECT r.queue, r.state, i.resource, i.amount, i.committed FROM reservation_items i"
        ' JOIN reservations r ON r.id = i.reservation_id WHERE r."partition" = :p',
        "counters": "SELECT scope_type, scope, resource, in_use, reserved, hard_limit FROM quota_usages"
        ' WHERE "partition" = :p',
        "journal": "SELECT queue, resource, delta, kind, reservation_id IS NULL FROM quota_journal"
        ' WHERE "partition" = :p',
    }
    if url.get_backend_name() != "sqlite":
        queries = {name: sql.replace('"', "`") for name, sql in queries.items()}
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                name: sorted(tuple(row) for row in conn.execute(text(sql), {"p": partition}))
                for name, sql in queries.items()
            }
    finally:
        engine.dispose()


def _configure_twins(engine: QuotaEngine) -> None:
    for partition in TWINS:
        engine.set_limits("root", {"cpu": 100, "memory": 1000}, partition=partition)
        engine.set_limits("root.a", {"cpu": 30}, partition=partition)
        engine.set_limits("root.a.x", {"memory": 200}, partition=partition)
        engine.set_limits("root.b", {"cpu": 50, "gpu": 4}, partition=partition)
        for queue in ("root.a", "root.a.x", "root.b"):  # first uses create the queues' counters
            engine.rollback(engine.reserve(queue, {"cpu": 1, "memory": 1, "gpu": 1}, partition=partition).id)


REQUESTS: list[tuple[str, dict[str, int]]] = [
    ("root.a", {"cpu": 10}),
    ("root.a.x", {"cpu": 5, "memory": 150}),
    ("root.b", {"cpu": 20, "gpu": 2}),
    ("root.a", {"cpu": 10, "memory": 10}),
    ("root.a.x", {"memory": 40}),
    ("root.b", {"gpu": 2}),
    ("root.a", {"cpu": 4}),
    ("root.b", {"gpu": 1}),  # over root.b's gpu: it and every one after go to their steps
    ("root.a", {"cpu": 1}),
    ("root.a.x", {"memory": 20}),  # over root.a.x's memory
]


def test_set_reserves_and_commits_leave_the_rows_of_one_at_a_time(
    core_db_url: URL, batched: QuotaEngine, unbatched: QuotaEngine
) -> None:
    _configure_twins(batched)
    statements = Statements(batched)
    together = batched.decide_all(
        [batched.prepare_reserve(q, r, partition="set", priority_class="high") for q, r in REQUESTS]
    )
    reserve_statements = statements.count
    alone: list[Reservation | Exception] = []
    for queue, resources in REQUESTS:
        try:
            alone.append(unbatched.reserve(queue, resources, partition="alone", priority_class="high"))
        except OverQuota as error:
            alone.append(error)
    assert [type(o) for o in together] == [type(o) for o in alone]
    assert [type(o) for o in together] == [*[Reservation] * 7, OverQuota, Reservation, OverQuota]
    # one batch: ~10 statements for the set, then the three steps (a dozen each)
    assert reserve_statements < 60
    assert _rows(core_db_url, "set") == _rows(core_db_url, "alone")

    made = [o for o in together if isinstance(o, Reservation)]
    twins = [o for o in alone if isinstance(o, Reservation)]
    assert [(r.queue, r.resources, r.state) for r in made] == [(r.queue, r.resources, r.state) for r in twins]
    before = statements.count
    committed = batched.decide_all([batched.prepare_commit(r.id) for r in made])
    assert statements.count - before < 20  # ~8 statements for all eight
    for reservation in twins:
        unbatched.commit(reservation.id)
    assert all(isinstance(c, Reservation) and c.state is ReservationState.COMMITTED for c in committed)
    assert [c.committed for c in committed if isinstance(c, Reservation)] == [r.resources for r in made]
    assert _rows(core_db_url, "set") == _rows(core_db_url, "alone")
    assert batched.audit() == []


def test_a_set_admits_the_longest_prefix_that_fits_and_the_rest_is_refused(batched: QuotaEngine) -> None:
    batched.set_limits("root.q", {"fpga": 10})
    batched.rollback(batched.reserve("root.q", {"fpga": 1}).id)
    outcomes = batched.decide_all([batched.prepare_reserve("root.q", {"fpga": 2}) for _ in range(8)])
    assert [type(o) for o in outcomes] == [*[Reservation] * 5, *[OverQuota] * 3]
    refused = outcomes[5]
    assert isinstance(refused, OverQuota)
    assert [(v.scope, v.limit, v.reserved, v.requested) for v in refused.violations] == [
        ("root.q", 10, 10, 2)
    ]
    usage = batched.usage("root.q")["fpga"]
    assert (usage.in_use, usage.reserved) == (0, 10)
    assert batched.audit() == []


def test_a_refused_request_leaves_room_for_a_smaller_one_after_it(batched: QuotaEngine) -> None:
    batched.set_limits("root.q", {"fpga": 10})
    batched.rollback(batched.reserve("root.q", {"fpga": 1}).id)
    sizes = [4, 4, 4, 2, 1]
    outcomes = batched.decide_all([batched.prepare_reserve("root.q", {"fpga": n}) for n in sizes])
    # 4 + 4 fit; the third 4 does not: it and those after it take their steps, in order
    assert [type(o) for o in outcomes] == [Reservation, Reservation, OverQuota, Reservation, OverQuota]
    assert batched.usage("root.q")["fpga"].reserved == 10
    assert batched.audit() == []


def test_keyed_tracked_and_new_queue_requests_take_their_steps_in_a_mixed_batch(batched: QuotaEngine) -> None:
    batched.set_limits("root.m", {"fpga": 20})
    batched.rollback(batched.reserve("root.m", {"fpga": 1}).id)
    outcomes = batched.decide_all(
        [
            batched.prepare_reserve("root.m", {"fpga": 2}),
            batched.prepare_reserve("root.m", {"fpga": 3}, key="k1"),
            batched.prepare_reserve("root.m", {"fpga": 3}, key="k1"),  # the same request again
            batched.prepare_reserve("root.m", {"fpga": 4}, key="k1"),  # the key, another request
            batched.prepare_reserve("root.m", {"fpga": 2}, user="alice", application="app-1"),
            batched.prepare_reserve("root.m", {"fpga": 2}),
            batched.prepare_reserve("root.m.new", {"fpga": 1}),  # no counters yet
            batched.prepare_reserve("root.m.new", {"fpga": 1}),
            batched.prepare_reserve("root.m", {"fpga": 50}),  # over the limit whatever the order
        ]
    )
    kinds = [type(o) for o in outcomes]
    assert kinds == [*[Reservation] * 3, IdempotencyConflict, *[Reservation] * 4, OverQuota]
    first, again = outcomes[1], outcomes[2]
    assert isinstance(first, Reservation)
    assert isinstance(again, Reservation)
    assert first.id == again.id
    tracked = outcomes[4]
    assert isinstance(tracked, Reservation)
    assert tracked.user == "alice"
    assert batched.usage("root.m")["fpga"].reserved == 2 + 3 + 2 + 2 + 1 + 1
    made = [o for o in outcomes if isinstance(o, Reservation)]
    committed = batched.decide_all([batched.prepare_commit(r.id) for r in made if r is not again])
    assert all(isinstance(c, Reservation) and c.state is ReservationState.COMMITTED for c in committed)
    usage = batched.usage("root.m")["fpga"]
    assert (usage.in_use, usage.reserved) == (11, 0)
    assert batched.audit() == []


def test_a_set_of_commits_leaves_repeats_unknown_expired_and_resolved_ids_to_their_steps(
    batched: QuotaEngine,
) -> None:
    batched.set_limits("root.c", {"fpga": 20})
    plain = [batched.reserve("root.c", {"fpga": 1}) for _ in range(3)]
    expiring = batched.reserve("root.c", {"fpga": 2}, ttl=0.2)
    gone = batched.reserve("root.c", {"fpga": 1})
    batched.rollback(gone.id)
    tracked = batched.reserve("root.c", {"fpga": 1}, user="bob")
    time.sleep(0.5)
    outcomes = batched.decide_all(
        [
            batched.prepare_commit(plain[0].id),
            batched.prepare_commit(plain[1].id),
            batched.prepare_commit(plain[0].id),  # a repeat: returned as committed
            batched.prepare_commit(ZERO_ID),
            batched.prepare_commit(expiring.id),  # past its expiry: expired on the spot
            batched.prepare_commit(gone.id),
            batched.prepare_commit(tracked.id),
            batched.prepare_commit(plain[2].id),
        ]
    )
    kinds = [type(o) for o in outcomes]
    assert kinds == [
        *(Reservation, Reservation, Reservation, ReservationNotFound),
        *(ReservationStateError, ReservationStateError, Reservation, Reservation),
    ]
    first, repeat = outcomes[0], outcomes[2]
    assert isinstance(first, Reservation)
    assert isinstance(repeat, Reservation)
    assert first.id == repeat.id
    assert repeat.state is ReservationState.COMMITTED
    assert batched.get(expiring.id).state is ReservationState.EXPIRED
    usage = batched.usage("root.c")["fpga"]
    assert (usage.in_use, usage.reserved) == (4, 0)
    assert batched.audit() == []


def test_threads_on_one_limit_get_exactly_what_fits(core_db_url: URL, batched: QuotaEngine) -> None:
    batched.set_limits("root.t", {"fpga": 37})
    batched.rollback(batched.reserve("root.t", {"fpga": 1}).id)
    made: list[Reservation] = []
    refused: list[OverQuota] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(8):
            try:
                reservation = batched.reserve("root.t", {"fpga": 1})
            except OverQuota as error:
                with lock:
                    refused.append(error)
                continue
            with lock:
                made.append(reservation)
            if len(made) % 3 == 0:
                batched.commit(reservation.id)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(made) == 37
    assert len(refused) == 48 - 37
    for reservation in made:
        batched.commit(reservation.id)
    usage = batched.usage("root.t")["fpga"]
    assert (usage.in_use, usage.reserved) == (37, 0)
    assert batched.batch_stats.largest > 1
    assert batched.audit() == []


def test_a_request_that_would_overflow_a_counter_is_left_to_its_step(batched: QuotaEngine) -> None:
    batched.rollback(batched.reserve("root.o", {"fpga": 1}).id)
    half = 2**62 - 1
    outcomes = batched.decide_all([batched.prepare_reserve("root.o", {"fpga": half}) for _ in range(3)])
    assert [type(o) for o in outcomes] == [Reservation, Reservation, CounterOverflow]
    assert batched.usage("root.o")["fpga"].reserved == 2 * half
    assert batched.audit() == []


def test_a_set_that_raises_is_undone_and_each_step_decides(
    batched: QuotaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    batched.set_limits("root.u", {"fpga": 5})
    batched.rollback(batched.reserve("root.u", {"fpga": 1}).id)
    inserted: list[int] = []  # by the set's multi-row insert
    failed: list[bool] = []
    insert, add = LedgerTx.insert_reservations, LedgerTx.apply_counter_deltas

    def counted(tx: LedgerTx, rows: Any) -> None:
        inserted.append(len(rows))
        insert(tx, rows)

    def failing_once(tx: LedgerTx, deltas: Any, now: Any) -> None:
        add(tx, deltas, now)  # the set's reservations and counters are written, then
        if inserted and not failed:
            failed.append(True)
            raise ReservationNotFound(ZERO_ID)  # a ledger error: all of it is undone

    monkeypatch.setattr(LedgerTx, "insert_reservations", counted)
    monkeypatch.setattr(LedgerTx, "apply_counter_deltas", failing_once)
    operations = [batched.prepare_reserve("root.u", {"fpga": 2}) for _ in range(3)]
    retries = dict(batched.driver.retries)
    outcomes = _flusher(batched).run_many([o.request for o in operations])
    assert dict(batched.driver.retries) == retries  # the batch ran once
    assert inserted == [2]  # the set admitted two before it failed, and its steps decided them
    assert failed == [True]
    assert batched.batch_stats.fallbacks == 0  # decided in the batch, not one by one after it
    assert [type(o) for o in outcomes] == [Reservation, Reservation, OverQuota]
    assert batched.usage("root.u")["fpga"].reserved == 4
    assert batched.audit() == []


def _flusher(engine: QuotaEngine) -> GroupCommit:
    assert engine.group_commit is not None
    return engine.group_commit
