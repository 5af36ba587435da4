"""Group commit (``batching=True``): one transaction decides many concurrent requests, each
exactly as if the batch had run them one after another, on every backend.

To put known requests into one batch, a test holds the flusher in a transaction of a step that
waits on an event, queues its requests from threads while it waits, then lets it go: the
requests queued meanwhile make up the next batch (the stats say so).

These are the batching machinery's own tests (leading, closing, failures, retries). What a
batch decides is tested on every decision path (``test_batches_decide_as_alone.py``,
``test_tracked_batches.py``); the PostgreSQL section at the end is path-specific: how many
requests each set call of a batch is given, and what they decline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from quota_ledger import (
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidRequest,
    OverQuota,
    QuotaEngine,
    QuotaLedgerError,
    ReservationNotFound,
    ReservationState,
    ReservationStateError,
)
from quota_ledger.driver import pg_functions
from quota_ledger.driver.pg_cursor import Call, PgCursor
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import reserve_function
from quota_ledger.ledger.group_commit import Deciders, GroupCommit
from quota_ledger.model import requests
from quota_ledger.model.values import Reservation

Outcome = tuple[str, Any]  # ("ok", value) or ("error", exception)


@pytest.fixture
def batched(db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(db_url, batching=True, pool_size=4)
    yield engine
    engine.close()


def _flusher(engine: QuotaEngine) -> GroupCommit:
    assert engine.group_commit is not None
    return engine.group_commit


class HeldFlusher:
    """Holds the engine's flusher inside a transaction until :meth:`release`."""

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.thread = threading.Thread(target=self._hold)
        self.thread.start()
        assert self.entered.wait(10), "the flusher never ran the holding step"

    def _hold(self) -> None:
        def step(tx: LedgerTx) -> None:
            self.entered.set()
            self.gate.wait(20)

        _flusher(self.engine).run(step)

    def release(self) -> None:
        self.gate.set()
        self.thread.join(20)


def in_one_batch(
    engine: QuotaEngine, calls: list[Callable[[], Any]], *, fails: bool = False
) -> list[Outcome]:
    """Run ``calls`` on threads so that one batch decides them all; their outcomes in order.
    ``fails``: the batch fails and its calls are decided one transaction each."""
    held = HeldFlusher(engine)
    outcomes: list[Outcome | None] = [None] * len(calls)

    def call(i: int) -> None:
        try:
            outcomes[i] = ("ok", calls[i]())
        except Exception as error:  # the outcome under test
            outcomes[i] = ("error", error)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while _flusher(engine).pending < len(calls):
        assert time.monotonic() < deadline, "the calls never queued"
        time.sleep(0.005)
    before = engine.batch_stats
    held.release()
    for thread in threads:
        thread.join(30)
    after = engine.batch_stats
    if fails:
        assert (after.batches - before.batches, after.fallbacks - before.fallbacks) == (1, 1)
    else:
        # the holding step's batch, then one batch of every call
        assert (after.batches - before.batches, after.requests - before.requests) == (2, 1 + len(calls))
        assert after.largest >= len(calls)
    return [o for o in outcomes if o is not None]


def _errors(outcomes: list[Outcome]) -> list[type[BaseException]]:
    return sorted((type(v) for k, v in outcomes if k == "error"), key=lambda t: t.__name__)


def test_a_refused_request_leaves_the_rest_of_its_batch(batched: QuotaEngine) -> None:
    batched.set_limits("root.a", {"fpga": 3})
    outcomes = in_one_batch(
        batched,
        [
            lambda: batched.reserve("root.a", {"fpga": 2}),
            lambda: batched.reserve("root.a", {"fpga": 2}),
            lambda: batched.reserve("root.a", {"fpga": 1}),
            lambda: batched.commit("00000000-0000-0000-0000-000000000000"),
        ],
    )
    # In any order one of the 2s and the 1 fit, the other 2 does not; the unknown id is refused.
    assert _errors(outcomes) == [OverQuota, ReservationNotFound]
    made = [v for k, v in outcomes if k == "ok"]
    assert sorted(r.resources["fpga"] for r in made) == [1, 2]
    assert batched.usage("root.a")["fpga"].reserved == 3
    for reservation in made:
        assert batched.get(reservation.id).state is ReservationState.PENDING
    assert batched.audit() == []


def test_one_key_twice_in_a_batch_is_one_reservation(batched: QuotaEngine) -> None:
    batched.set_limits("root.a", {"fpga": 10})
    outcomes = in_one_batch(batched, [lambda: batched.reserve("root.a", {"fpga": 2}, key="k")] * 3)
    assert _errors(outcomes) == []
    assert len({v.id for _, v in outcomes}) == 1
    assert batched.usage("root.a")["fpga"].reserved == 2
    # across batches too: the key returns the same reservation, another request conflicts
    assert batched.reserve("root.a", {"fpga": 2}, key="k").id == outcomes[0][1].id
    with pytest.raises(IdempotencyConflict):
        batched.reserve("root.a", {"fpga": 3}, key="k")


def test_one_key_for_two_requests_in_a_batch_conflicts_once(batched: QuotaEngine) -> None:
    batched.set_limits("root.a", {"fpga": 10})
    outcomes = in_one_batch(
        batched,
        [
            lambda: batched.reserve("root.a", {"fpga": 2}, key="k"),
            lambda: batched.reserve("root.a", {"fpga": 3}, key="k"),
        ],
    )
    assert _errors(outcomes) == [IdempotencyConflict]
    (made,) = [v for k, v in outcomes if k == "ok"]
    assert batched.usage("root.a")["fpga"].reserved == made.resources["fpga"]
    assert batched.get_by_key("k").id == made.id


def test_commit_and_rollback_of_one_reservation_in_a_batch_resolve_it_once(batched: QuotaEngine) -> None:
    batched.set_limits("root.a", {"fpga": 10})
    first = batched.reserve("root.a", {"fpga": 2})
    second = batched.reserve("root.a", {"fpga": 3})
    batched.commit(second.id)
    outcomes = in_one_batch(
        batched,
        [
            lambda: batched.commit(first.id),
            lambda: batched.rollback(first.id),
            lambda: batched.release_reservation(second.id),
            lambda: batched.release_reservation(second.id),
        ],
    )
    # commit then rollback: the rollback is refused; rollback then commit: the commit is.
    assert _errors(outcomes) == [ReservationStateError]
    state = batched.get(first.id).state
    assert state in (ReservationState.COMMITTED, ReservationState.ROLLED_BACK)
    usage = batched.usage("root.a")["fpga"]
    assert (usage.in_use, usage.reserved) == ((2 if state is ReservationState.COMMITTED else 0), 0)
    assert batched.get(second.id).released_at is not None
    assert batched.audit() == []


def test_a_hot_queue_admits_exactly_its_limit_from_32_threads(batched: QuotaEngine) -> None:
    batched.set_limits("root.hot", {"fpga": 40})
    admitted: list[str] = []
    refused: list[BaseException] = []
    together = threading.Barrier(32)

    def caller() -> None:
        together.wait(30)  # all at once, however slowly the threads start
        for _ in range(4):
            try:
                made = batched.reserve("root.hot", {"fpga": 1})
                batched.commit(made.id)
                admitted.append(made.id)
            except OverQuota as error:
                refused.append(error)

    threads = [threading.Thread(target=caller) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert (len(admitted), len(refused)) == (40, 128 - 40)
    usage = batched.usage("root.hot")["fpga"]
    assert (usage.in_use, usage.reserved) == (40, 0)
    stats = batched.batch_stats
    assert stats.requests == 128 + 40  # every reserve and commit, each decided once
    # Many requests per transaction: the 32 first reserves alone fill batches of several, whatever
    # the machine's load does to the calls after them (one run read 101 batches for 168 requests).
    assert stats.largest >= 4, stats
    assert stats.batches < stats.requests, stats
    assert batched.audit() == []


def test_a_call_returns_only_once_its_batch_has_committed(batched: QuotaEngine, db_url: URL) -> None:
    batched.set_limits("root.a", {"fpga": 10})
    observer = QuotaEngine.from_url(db_url)
    seen: list[object] = []
    slow_done = threading.Event()

    def slow(tx: LedgerTx) -> None:
        time.sleep(0.5)  # keeps the batch's transaction open after the reservation's step
        slow_done.set()

    def reserve_then_look() -> None:
        made = batched.reserve("root.a", {"fpga": 1})
        seen.append(slow_done.is_set())
        seen.append(observer.get(made.id).state)  # another connection sees it committed

    try:
        flusher = _flusher(batched)
        held = HeldFlusher(batched)
        caller = threading.Thread(target=reserve_then_look)
        caller.start()
        later = threading.Thread(target=lambda: flusher.run(slow, order=("~",)))  # after the reserve
        while flusher.pending < 1:
            time.sleep(0.005)
        later.start()
        while flusher.pending < 2:
            time.sleep(0.005)
        held.release()
        caller.join(20)
        later.join(20)
    finally:
        observer.close()
    assert seen == [True, ReservationState.PENDING]


def test_a_poison_request_fails_alone(batched: QuotaEngine) -> None:
    batched.set_limits("root.a", {"fpga": 10})

    def poison(tx: LedgerTx) -> None:
        tx.conn.execute(text("SELECT no_such_function_here(1)"))

    flusher = _flusher(batched)
    outcomes = in_one_batch(
        batched,
        [
            lambda: batched.reserve("root.a", {"fpga": 2}),
            lambda: flusher.run(poison),
            lambda: batched.reserve("root.a", {"fpga": 3}),
        ],
        fails=True,
    )
    kinds = [k for k, _ in outcomes]
    assert kinds == ["ok", "error", "ok"]
    assert isinstance(outcomes[1][1], QuotaLedgerError)
    assert batched.usage("root.a")["fpga"].reserved == 5
    assert batched.batch_stats.fallbacks == 1


def test_invalid_arguments_raise_in_the_caller_without_entering_a_batch(batched: QuotaEngine) -> None:
    held = HeldFlusher(batched)  # a queued request would wait for it
    try:
        before = batched.batch_stats
        with pytest.raises(InvalidRequest):
            batched.reserve("root.a", {"fpga": -1, "x y": 1})
        with pytest.raises(InvalidRequest):
            batched.commit("")
        with pytest.raises(InvalidRequest):
            batched.release_reservation("not an id at all\n")
        assert _flusher(batched).pending == 0
    finally:
        held.release()
    assert batched.batch_stats.requests == before.requests + 1  # the holding step only


def test_close_decides_what_is_queued_then_refuses(db_url: URL) -> None:
    engine = QuotaEngine.from_url(db_url, batching=True, pool_size=4)
    engine.set_limits("root.a", {"fpga": 10})
    held = HeldFlusher(engine)
    made: list[object] = []
    callers = [
        threading.Thread(target=lambda: made.append(engine.reserve("root.a", {"fpga": 1}))) for _ in range(5)
    ]
    for caller in callers:
        caller.start()
    while _flusher(engine).pending < 5:
        time.sleep(0.005)
    closer = threading.Thread(target=engine.close)
    closer.start()
    held.release()
    closer.join(30)
    for caller in callers:
        caller.join(30)
    assert not closer.is_alive()
    assert len(made) == 5
    with pytest.raises(DatabaseUnavailable):
        engine.reserve("root.a", {"fpga": 1})
    again = QuotaEngine.from_url(db_url)
    try:
        assert again.usage("root.a")["fpga"].reserved == 5
    finally:
        again.close()


def test_decide_all_beyond_max_batch_spans_batches_and_leads_when_handed(db_url: URL) -> None:
    engine = QuotaEngine.from_url(db_url, batching=True, max_batch=8, pool_size=4)
    try:
        engine.set_limits("root.a", {"fpga": 18})
        operations = [engine.prepare_reserve("root.a", {"fpga": 1}) for _ in range(20)]
        flusher = _flusher(engine)
        held = HeldFlusher(engine)
        many: list[Reservation | Exception] = []
        alone: list[Outcome] = []

        def single() -> None:
            try:
                alone.append(("ok", engine.reserve("root.a", {"fpga": 1})))
            except QuotaLedgerError as error:
                alone.append(("error", error))

        callers = [threading.Thread(target=lambda: many.extend(engine.decide_all(operations)))]
        callers[0].start()
        while flusher.pending < 20:
            time.sleep(0.005)
        callers.append(threading.Thread(target=single))  # queued behind all twenty
        callers[1].start()
        while flusher.pending < 21:
            time.sleep(0.005)
        before = engine.batch_stats
        held.release()
        for caller in callers:
            caller.join(30)
        after = engine.batch_stats
        # the holding step's batch, then the 21 requests in queue order, 8 a batch at most
        assert (after.batches - before.batches, after.requests - before.requests) == (1 + 3, 1 + 21)
        assert after.largest == 8
        assert [type(o) for o in many] == [Reservation] * 18 + [OverQuota] * 2
        assert len({o.id for o in many if isinstance(o, Reservation)}) == 18
        assert [(kind, type(value)) for kind, value in alone] == [("error", OverQuota)]
        assert engine.usage("root.a")["fpga"].reserved == 18
        assert engine.audit() == []
    finally:
        engine.close()


def test_run_many_returns_values_and_errors_in_order(db_url: URL) -> None:
    engine = QuotaEngine.from_url(db_url, batching=True, pool_size=4)
    flusher = _flusher(engine)

    def refused(tx: LedgerTx) -> int:
        raise ReservationNotFound("r")

    try:
        assert flusher.run_many([]) == []
        outcomes = flusher.run_many([Deciders(lambda tx: 1), Deciders(refused), Deciders(lambda tx: 3)])
        assert [o if isinstance(o, int) else type(o) for o in outcomes] == [1, ReservationNotFound, 3]
        (only,) = flusher.run_many([Deciders(refused)])  # alone: in a transaction of its own
        assert isinstance(only, ReservationNotFound)
    finally:
        engine.close()
    with pytest.raises(DatabaseUnavailable):
        flusher.run_many([Deciders(lambda tx: 1)])


def test_bad_options_are_refused() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidRequest):
            QuotaEngine.from_url("sqlite://", batching=True, max_batch=bad)  # type: ignore[arg-type]


def test_a_connection_lost_mid_batch_retries_the_whole_batch(server_db_url: URL) -> None:
    engine = QuotaEngine.from_url(server_db_url, batching=True, pool_size=4)
    side = create_engine(server_db_url, isolation_level="AUTOCOMMIT")
    postgres = server_db_url.get_backend_name() == "postgresql"
    kills: list[int] = []

    def killed_once(tx: LedgerTx) -> None:
        if tx.attempt == 0:
            me = tx.conn.execute(
                text("SELECT pg_backend_pid()" if postgres else "SELECT CONNECTION_ID()")
            ).scalar_one()
            with side.connect() as conn:
                conn.execute(
                    text("SELECT pg_terminate_backend(:p)" if postgres else f"KILL {int(me)}"), {"p": me}
                )
            kills.append(me)
        tx.conn.execute(text("SELECT 1"))

    try:
        engine.set_limits("root.a", {"fpga": 10})
        flusher = _flusher(engine)
        outcomes = in_one_batch(
            engine,
            [
                lambda: engine.reserve("root.a", {"fpga": 1}, key="one"),
                lambda: engine.reserve("root.a", {"fpga": 2}, key="two"),
                lambda: engine.reserve("root.a", {"fpga": 3}),
                lambda: flusher.run(killed_once, order=("~",)),  # the last step of the batch
            ],
        )
        assert _errors(outcomes) == []
        assert len(kills) == 1
        assert engine.driver.retries["disconnect"] >= 1
        assert engine.usage("root.a")["fpga"].reserved == 6
        assert engine.get_by_key("one").id == outcomes[0][1].id
        assert engine.get_by_key("two").id == outcomes[1][1].id
        assert engine.audit() == []
    finally:
        engine.close()
        side.dispose()


def test_the_set_functions_decline_without_aborting_the_transaction(postgres_url: URL) -> None:
    engine = QuotaEngine.from_url(postgres_url, batching=True)
    try:
        engine.set_limits("root.a", {"fpga": 1})
        made = engine.reserve("root.a", {"fpga": 1})
        flusher = _flusher(engine)
        assert flusher.functions

        def commits(tx: LedgerTx, rid: str) -> int:
            call = pg_functions.commit_many([pg_functions.commit_params(rid, "op")])
            return len(tx.conn.exec_driver_sql(call.sql, call.params).fetchall())

        def declined_then_committed(tx: LedgerTx) -> tuple[int, int, str]:
            missing = commits(tx, "nope")  # an unknown id: the commit declines; the transaction goes on
            request = requests.build(
                partition="default",
                queue="root.a",
                resources={"fpga": 1},
                user=None,
                groups=(),
                application=None,
                ttl=None,
                default_ttl=300.0,
                key=None,
                kube={"usage": {}, "scopes": {"priorityClass": None}},
                namespace="a",
            )
            call = reserve_function.in_batch(tx, engine.rules, request)
            assert call is not None
            assert tx.pg is not None
            (rows,) = tx.pg.pipelined([call.build([call.params])])
            assert rows == []  # over the limit: declined, nothing written
            done = commits(tx, made.id)
            return missing, done, tx.conn.execute(text("SELECT 'alive'")).scalar_one()

        assert flusher.run(declined_then_committed) == (0, 1, "alive")
        assert engine.get(made.id).state is ReservationState.COMMITTED
        assert engine.usage("root.a")["fpga"].in_use == 1
        assert engine.audit() == []
    finally:
        engine.close()


# -- PostgreSQL: the set calls (quota_ledger_reserve_many, quota_ledger_commit_many) ------------
class SetCalls:
    """How many requests each set call a batch sent was asked to decide."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: dict[str, list[int]] = {"reserve_many": [], "commit_many": []}
        real = PgCursor.pipelined
        lock = threading.Lock()

        def spy(fast: PgCursor, calls: Sequence[Call]) -> list[list[Any]]:
            with lock:
                for made in calls:
                    for name, sizes in self.sizes.items():
                        if f"quota_ledger_{name}(" in made.sql:
                            sizes.append(len(made.params["ids"]))
            return real(fast, calls)

        monkeypatch.setattr(PgCursor, "pipelined", spy)


@pytest.fixture
def set_calls(monkeypatch: pytest.MonkeyPatch) -> SetCalls:
    return SetCalls(monkeypatch)


def test_one_batch_decides_its_plain_reserves_and_commits_by_one_call_each(
    postgres_url: URL, set_calls: SetCalls
) -> None:
    engine = QuotaEngine.from_url(postgres_url, batching=True, pool_size=4)
    try:
        engine.set_limits("root.a", {"fpga": 6})
        engine.set_limits("root.b", {"fpga": 1})
        engine.rollback(engine.reserve("root.b", {"fpga": 1}).id)  # root.b's counters; root.c has none
        held = [engine.reserve("root.a", {"fpga": 1}) for _ in range(2)]
        outcomes = in_one_batch(
            engine,
            [lambda: engine.reserve("root.a", {"fpga": 1}) for _ in range(5)]
            + [
                lambda: engine.reserve("root.b", {"fpga": 2}),  # over root.b: refused by its own step
                lambda: engine.reserve("root.c", {"fpga": 1}),  # a first use: its own step
                lambda: engine.commit(held[0].id),
                lambda: engine.commit(held[1].id),
                lambda: engine.commit(held[1].id),
            ],
        )
        # root.a has room for 4 more: one of the five is refused
        assert _errors(outcomes) == [OverQuota, OverQuota]
        assert set_calls.sizes == {"reserve_many": [7], "commit_many": [3]}
        made = [v for k, v in outcomes[:5] if k == "ok"]
        assert len(made) == 4
        for reservation in made:
            assert engine.get(reservation.id) == reservation
        assert engine.get(held[1].id) == outcomes[-1][1] == outcomes[-2][1]
        assert outcomes[-1][1].state is ReservationState.COMMITTED
        usage = engine.usage("root.a")["fpga"]
        assert (usage.in_use, usage.reserved) == (2, 4)
        assert engine.usage("root.c")["fpga"].reserved == 1
        assert engine.usage("root.b")["fpga"].reserved == 0
        assert engine.audit() == []
    finally:
        engine.close()


def test_two_batching_engines_admit_exactly_a_hot_queues_limit(
    postgres_url: URL, set_calls: SetCalls
) -> None:
    engines = [QuotaEngine.from_url(postgres_url, batching=True, pool_size=4) for _ in range(2)]
    admitted: list[str] = []
    refused: list[BaseException] = []
    unexpected: list[BaseException] = []
    try:
        engines[0].set_limits("root.hot", {"fpga": 30})
        engines[0].rollback(engines[0].reserve("root.hot", {"fpga": 1}).id)  # its counters exist

        def caller(engine: QuotaEngine) -> None:
            for _ in range(3):
                try:
                    made = engine.reserve("root.hot", {"fpga": 1})
                    engine.commit(made.id)
                    admitted.append(made.id)
                except OverQuota as error:
                    refused.append(error)
                except Exception as error:  # reported below
                    unexpected.append(error)

        threads = [threading.Thread(target=caller, args=(engines[n % 2],)) for n in range(24)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert unexpected == []
        assert (len(admitted), len(set(admitted)), len(refused)) == (30, 30, 72 - 30)
        usage = engines[0].usage("root.hot")["fpga"]
        assert (usage.in_use, usage.reserved) == (30, 0)
        for engine in engines:
            stats = engine.batch_stats
            assert stats.largest > 1, stats
        # the set calls decided batches of several requests
        assert max(set_calls.sizes["reserve_many"], default=0) > 1, set_calls.sizes
        assert max(set_calls.sizes["commit_many"], default=0) > 1, set_calls.sizes
        assert engines[0].audit() == []
    finally:
        for engine in engines:
            engine.close()


def test_one_key_from_many_threads_in_a_set_call_is_one_reservation(
    postgres_url: URL, set_calls: SetCalls
) -> None:
    engine = QuotaEngine.from_url(postgres_url, batching=True, pool_size=4)
    try:
        engine.set_limits("root.a", {"fpga": 10})
        engine.rollback(engine.reserve("root.a", {"fpga": 1}).id)
        held = HeldFlusher(engine)
        outcomes: list[Outcome] = []

        def call(amount: int) -> None:
            try:
                outcomes.append(("ok", engine.reserve("root.a", {"fpga": amount}, key="k")))
            except Exception as error:  # the outcome under test
                outcomes.append(("error", error))

        # four of the same request queue first, then another request with the same key
        threads = [threading.Thread(target=call, args=(2,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        while _flusher(engine).pending < 4:
            time.sleep(0.005)
        threads.append(threading.Thread(target=call, args=(3,)))
        threads[-1].start()
        while _flusher(engine).pending < 5:
            time.sleep(0.005)
        held.release()
        for thread in threads:
            thread.join(30)
        assert set_calls.sizes["reserve_many"] == [5]
        assert _errors(outcomes) == [IdempotencyConflict]
        made = {v.id for k, v in outcomes if k == "ok"}
        assert len(made) == 1
        assert engine.get_by_key("k").id in made
        assert engine.usage("root.a")["fpga"].reserved == 2
        assert engine.audit() == []
    finally:
        engine.close()


def test_one_key_from_two_batching_engines_at_once_is_one_reservation(postgres_url: URL) -> None:
    engines = [QuotaEngine.from_url(postgres_url, batching=True, pool_size=4) for _ in range(2)]
    try:
        engines[0].set_limits("root.a", {"fpga": 100})
        engines[0].rollback(engines[0].reserve("root.a", {"fpga": 1}).id)
        for round_ in range(5):
            got: list[str] = []
            errors: list[BaseException] = []
            start = threading.Barrier(16)

            def call(
                engine: QuotaEngine,
                key: str = f"k{round_}",
                start: threading.Barrier = start,
                got: list[str] = got,
                errors: list[BaseException] = errors,
            ) -> None:
                start.wait(10)
                try:
                    got.append(engine.reserve("root.a", {"fpga": 1}, key=key).id)
                    # and some other traffic for the batches
                    engine.commit(engine.reserve("root.a", {"fpga": 1}).id)
                except Exception as error:  # reported below
                    errors.append(error)

            threads = [threading.Thread(target=call, args=(engines[n % 2],)) for n in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert errors == []
            assert len(got) == 16
            assert len(set(got)) == 1
            assert engines[1].get_by_key(f"k{round_}").id == got[0]
        usage = engines[0].usage("root.a")["fpga"]
        assert (usage.in_use, usage.reserved) == (5 * 16, 5)
        assert engines[0].audit() == []
    finally:
        for engine in engines:
            engine.close()


def test_plain_reserves_of_two_partitions_are_one_set_call_each(
    postgres_url: URL, set_calls: SetCalls
) -> None:
    engine = QuotaEngine.from_url(postgres_url, batching=True, pool_size=4)
    try:
        for partition, limit in (("default", 3), ("other", 2)):
            engine.set_limits("root.a", {"fpga": limit}, partition=partition)
            engine.rollback(engine.reserve("root.a", {"fpga": 1}, partition=partition).id)
        outcomes = in_one_batch(
            engine,
            [lambda: engine.reserve("root.a", {"fpga": 1}) for _ in range(3)]
            + [lambda: engine.reserve("root.a", {"fpga": 1}, partition="other") for _ in range(3)],
        )
        assert sorted(set_calls.sizes["reserve_many"]) == [3, 3]
        assert _errors(outcomes) == [OverQuota]  # the third of "other" only
        assert [v.partition for k, v in outcomes if k == "ok"].count("other") == 2
        for k, v in outcomes:
            if k == "ok":
                assert engine.get(v.id) == v
        assert engine.usage("root.a")["fpga"].reserved == 3
        assert engine.usage("root.a", partition="other")["fpga"].reserved == 2
        assert engine.audit() == []
    finally:
        engine.close()
