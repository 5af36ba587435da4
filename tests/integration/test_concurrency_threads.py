"""Many threads on one scope of a real database, with a sweeper, an auditor and an observer.

What must hold however the operations interleave:

- no subtree counter is ever seen above its limit, and every subtree counter equals the sum of
  the queue counters below it in every committed snapshot (each call is one transaction);
- at the end the counters equal what the tables' history says (computed here, independently of
  the library's audit) and :meth:`QuotaEngine.audit` agrees;
- on PostgreSQL the documented lock order means no deadlock is ever retried.

The test bounds its own run time (``_DURATION`` seconds of load plus setup and checks).
"""

from __future__ import annotations

import functools
import random
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import pytest
from concurrent_load import (
    _DURATION,
    _JOIN_GRACE,
    _R,
    _U,
    Books,
    Crew,
    Outcome,
    _assert_counters_match_history,
    _committed_sums,
    _random_request,
    _raw_engine,
    _read_counters,
    _released_in_journal,
    _snapshot_problems,
)
from sqlalchemy import select
from sqlalchemy.engine import URL

from quota_ledger import (
    DatabaseUnavailable,
    OverQuota,
    QuotaEngine,
    Reservation,
    ReservationState,
    ReservationStateError,
)
from quota_ledger.driver.dialect import utcnow

# -- many threads on one scope --------------------------------------------------------------
QUEUES = ("root.team.a", "root.team.b")
# root.team.a binds gpu, root binds memory, root.team binds gpu for b: different limits refuse.
LIMITS: dict[str, dict[str, int]] = {
    "root": {"gpu": 60, "memory": 500},
    "root.team": {"gpu": 48, "memory": 600},
    "root.team.a": {"gpu": 24, "memory": 350},
}
SHORT_TTL = 0.05
LONG_TTL = 120.0


@dataclass
class Held:
    reservation: Reservation
    short: bool


def _check_refusal(error: OverQuota, request: Mapping[str, int]) -> None:
    assert error.violations, "OverQuota without a violation"
    for v in error.violations:
        assert v.requested == request[v.resource]
        assert v.in_use + v.reserved + v.requested > v.limit, f"refused although it fits: {v}"
        assert v.limit == LIMITS[v.scope][v.resource]


def _worker(
    engine: QuotaEngine, books: Books, rng: random.Random, deadline: float, stop: threading.Event
) -> None:
    held: list[Held] = []
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            _one_operation(engine, books, rng, held)
        except DatabaseUnavailable as error:
            # The database is healthy here: giving up is a failure, asserted after the run so
            # that every other invariant is still checked. The operation did not happen (a
            # transaction that was never committed), so the books stay right.
            with books.lock:
                books.stats["gave_up"] += 1
                books.gave_up.append(repr(error))


def _one_operation(engine: QuotaEngine, books: Books, rng: random.Random, held: list[Held]) -> None:
    roll = rng.random()
    if roll < 0.25:
        _do_release(engine, books, rng)
    elif not held or (roll < 0.55 and len(held) < 3):
        if not _do_reserve(engine, books, rng, held):
            _do_release(engine, books, rng)  # make room, as a scheduler would
    elif roll < 0.72:
        _do_commit(engine, books, held.pop(rng.randrange(len(held))), None)
    elif roll < 0.84:
        item = held.pop(rng.randrange(len(held)))
        partial = {res: rng.randint(0, amount) for res, amount in item.reservation.resources.items()}
        if len(partial) > 1 and rng.random() < 0.3:
            del partial[rng.choice(sorted(partial))]  # an unnamed resource commits nothing
        _do_commit(engine, books, item, partial)
    else:
        _do_rollback(engine, books, held.pop(rng.randrange(len(held))))


def _do_reserve(engine: QuotaEngine, books: Books, rng: random.Random, held: list[Held]) -> bool:
    """Reserve something; False if it was refused."""
    queue = rng.choice(QUEUES)
    request = _random_request(rng)
    short = rng.random() < 0.25
    try:
        r = engine.reserve(queue, request, ttl=SHORT_TTL if short else LONG_TTL)
    except OverQuota as error:
        _check_refusal(error, request)
        books.count("refused")
        return False
    assert r.state is ReservationState.PENDING
    assert (r.queue, r.resources) == (queue, request)
    with books.lock:
        assert r.id not in books.outcomes
        books.outcomes[r.id] = Outcome(queue, dict(request), short)
        books.stats["reserved"] += 1
    if short and rng.random() < 0.5:
        books.count("abandoned")  # left for the sweeper
    else:
        held.append(Held(r, short))
    return True


def _commit_or_refusal(
    engine: QuotaEngine, reservation_id: str, partial: dict[str, int] | None
) -> Reservation | ReservationStateError:
    try:
        return engine.commit(reservation_id, partial)
    except ReservationStateError as error:
        return error


def _do_commit(engine: QuotaEngine, books: Books, item: Held, partial: dict[str, int] | None) -> None:
    r = item.reservation
    done = _commit_or_refusal(engine, r.id, partial)
    if isinstance(done, ReservationStateError):
        # Only a reservation whose ttl ran out may refuse a commit: expired by the sweeper or
        # on the spot.
        assert item.short, f"long-lived reservation refused commit: {done}"
        assert done.state is ReservationState.EXPIRED, done
        with books.lock:
            books.outcomes[r.id].state = ReservationState.EXPIRED
            books.stats["commit_expired"] += 1
        return
    expected = dict(r.resources) if partial is None else {res: partial.get(res, 0) for res in r.resources}
    assert done.state is ReservationState.COMMITTED
    assert done.committed == expected
    with books.lock:
        outcome = books.outcomes[r.id]
        outcome.state, outcome.committed = ReservationState.COMMITTED, expected
        for res, amount in expected.items():
            books.committed[(r.queue, res)] += amount
            books.releasable[(r.queue, res)] += amount
        books.stats["commit_partial" if partial is not None else "commit_full"] += 1


def _do_rollback(engine: QuotaEngine, books: Books, item: Held) -> None:
    done = engine.rollback(item.reservation.id)
    allowed = {ReservationState.ROLLED_BACK}
    if item.short:
        allowed.add(ReservationState.EXPIRED)  # the sweeper may have got there first
    assert done.state in allowed, done
    with books.lock:
        books.outcomes[done.id].state = done.state
        books.stats[f"rollback_{done.state.value}"] += 1


def _do_release(engine: QuotaEngine, books: Books, rng: random.Random) -> None:
    with books.lock:
        candidates = sorted(pair for pair, amount in books.releasable.items() if amount > 0)
        if not candidates:
            return
        queue, res = rng.choice(candidates)
        available = books.releasable[(queue, res)]
        amount = available if rng.random() < 0.3 else rng.randint(1, available)
        books.releasable[(queue, res)] -= amount  # nobody else may release these units meanwhile
    engine.release(queue, {res: amount})  # never underflows: at least this much is in use
    with books.lock:
        books.released[(queue, res)] += amount
        books.stats["released"] += 1


def _observer(url: URL, crew: Crew, books: Books, problems: list[str]) -> None:
    raw = _raw_engine(url)
    try:
        with raw.connect() as conn:
            while not crew.stop.is_set():
                # The limit check on the subtree rows alone, then the cross-check of the whole
                # table (subtree rows = sums of queue rows) in one statement, one snapshot.
                rows = conn.execute(
                    select(_U.scope, _U.resource, _U.in_use, _U.reserved, _U.hard_limit).where(
                        _U.scope_type == "subtree"
                    )
                ).all()
                for scope, resource, in_use, reserved, limit in rows:
                    if in_use < 0 or reserved < 0 or in_use + reserved > limit:
                        problems.append(f"{scope}/{resource}: in_use {in_use} reserved {reserved} > {limit}")
                problems.extend(_snapshot_problems(_read_counters(conn)))
                books.count("observations")
                crew.stop.wait(0.005)
    finally:
        raw.dispose()


def _sweeper(engine: QuotaEngine, crew: Crew, books: Books) -> None:
    while not crew.stop.is_set():
        n = engine.expire(batch_size=7)
        with books.lock:
            books.stats["swept"] += n
            books.stats["sweeps"] += 1
        crew.stop.wait(0.02)


def _auditor(engine: QuotaEngine, crew: Crew, books: Books, drifts: list[object]) -> None:
    while not crew.stop.is_set():
        drifts.extend(engine.audit())  # REPEATABLE READ: one snapshot, so clean under load too
        books.count("audits")
        crew.stop.wait(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("batching", [False, True], ids=["per-call", "batching"])
def test_threads_hammering_one_scope_never_exceed_limits(server_db_url: URL, batching: bool) -> None:
    backend = server_db_url.get_backend_name()
    seed = random.randrange(2**32)
    engine = QuotaEngine.from_url(server_db_url, pool_size=24, batching=batching)
    raw = _raw_engine(server_db_url)
    try:
        for queue, limits in LIMITS.items():
            engine.set_limits(queue, limits)
        books = Books()
        crew = Crew()
        snapshot_problems: list[str] = []
        drifts: list[object] = []
        deadline = time.monotonic() + _DURATION
        workers = [
            crew.spawn(
                f"worker-{i}",
                functools.partial(_worker, engine, books, random.Random(seed + i), deadline, crew.stop),
            )
            for i in range(16)
        ]
        helpers = [
            crew.spawn("observer", lambda: _observer(server_db_url, crew, books, snapshot_problems)),
            crew.spawn("sweeper", lambda: _sweeper(engine, crew, books)),
            crew.spawn("auditor", lambda: _auditor(engine, crew, books, drifts)),
        ]
        crew.join(workers, _DURATION + _JOIN_GRACE)
        crew.stop.set()
        crew.join(helpers, _JOIN_GRACE)
        crew.check()
        stats, retries = dict(books.stats), dict(engine.driver.retries)
        print(f"\n[{backend}] seed={seed} stats={stats} retries={retries} batches={engine.batch_stats}")

        assert snapshot_problems == [], snapshot_problems[:10]
        assert drifts == [], f"audit under load reported drift: {drifts[:5]}"
        # The run did what it is meant to: contention, refusals, every kind of operation.
        for what in ("reserved", "refused", "commit_full", "commit_partial", "released", "swept"):
            assert stats.get(what, 0) > 0, f"no {what!r} happened: {stats}"
        assert stats.get("observations", 0) >= 20, stats
        assert stats.get("audits", 0) >= 3, stats

        # Quiet now. Expire what ran out; whatever had run out before this sweep must be gone.
        with raw.connect() as conn:
            before_sweep = conn.execute(select(utcnow())).scalar_one()
        engine.expire()
        assert engine.audit() == []
        with raw.connect() as conn:
            _assert_counters_match_history(conn, books.released)
            assert _committed_sums(conn) == {p: a for p, a in books.committed.items() if a}
            assert _released_in_journal(conn) == {p: a for p, a in books.released.items() if a}
            rows = conn.execute(select(_R.id, _R.state, _R.expires_at)).all()
        stored = {r[0]: (ReservationState(r[1]), r[2]) for r in rows}
        assert stored.keys() == books.outcomes.keys(), "reservations the test never got, or lost ones"
        for rid, outcome in books.outcomes.items():
            state, expires_at = stored[rid]
            if outcome.state is not None:
                assert state is outcome.state, (rid, outcome, state)
            elif not outcome.short:
                assert state is ReservationState.PENDING, (rid, outcome, state)
            elif expires_at <= before_sweep:
                assert state is ReservationState.EXPIRED, (rid, outcome, state)
            else:
                assert state in (ReservationState.PENDING, ReservationState.EXPIRED), (rid, outcome, state)
        left_pending = sum(1 for state, _ in stored.values() if state is ReservationState.PENDING)
        assert left_pending > 0, "nothing pending at the end: the reserved counters were not checked"
        for queue in ("root", "root.team", *QUEUES):
            for res, use in engine.usage(queue).items():
                assert use.in_use >= 0, (queue, res, use)
                assert use.reserved >= 0, (queue, res, use)
                if use.limit is not None:
                    assert use.in_use + use.reserved <= use.limit

        assert retries.get("disconnect", 0) == 0, retries
        assert books.gave_up == [], (
            f"{len(books.gave_up)} operations failed with DatabaseUnavailable against a healthy "
            f"database ({retries.get('conflict', 0)} conflict retries, i.e. deadlocks): {books.gave_up[:3]}"
        )
        if batching:
            # A batch holds the locks of many requests at once, taken request after request:
            # against the sweeper's and the releases' own transactions that is not the one
            # lock order, and a deadlock retries the batch. Many requests per batch, though.
            assert engine.batch_stats.requests > 2 * engine.batch_stats.batches, engine.batch_stats
        elif backend == "postgresql":
            assert retries.get("conflict", 0) == 0, (
                f"deadlocks/serialization retries on PostgreSQL: {retries}"
            )
        elif retries.get("conflict", 0):
            warnings.warn(
                f"{backend}: {retries['conflict']} conflict retries (deadlock/lock wait) under load",
                stacklevel=1,
            )
    finally:
        raw.dispose()
        engine.close()
