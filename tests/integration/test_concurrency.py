"""Concurrency on real databases: many threads, killed connections, several processes.

What must hold however the operations interleave:

- no subtree counter is ever seen above its limit, and every subtree counter equals the sum of
  the queue counters below it in every committed snapshot (each call is one transaction);
- at the end the counters equal what the tables' history says (computed here, independently of
  the library's audit) and :meth:`QuotaEngine.audit` agrees;
- a retried call with an idempotency key returns the original reservation, never a second one;
- on PostgreSQL the documented lock order means no deadlock is ever retried.

Each test bounds its own run time (``_DURATION`` seconds of load plus setup and checks).
"""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import warnings
from collections import Counter as Tally
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Connection, Engine, create_engine, exc, func, select, text
from sqlalchemy.engine import URL

from quota_ledger import (
    DatabaseUnavailable,
    OverQuota,
    QuotaEngine,
    QuotaLedgerError,
    Reservation,
    ReservationState,
    ReservationStateError,
)
from quota_ledger.driver.dialect import normalize_url, utcnow
from quota_ledger.driver.schema import quota_journal, quota_usages, reservation_items, reservations

T = TypeVar("T")
PairKey = tuple[str, str]  # (queue, resource)
CounterKey = tuple[str, str, str]  # (scope_type, scope, resource)

PARTITION = "default"
_DURATION = 8.0  # seconds of load per test run
_JOIN_GRACE = 30.0  # a thread still running this long after the load stopped is a hang


# -- reading the tables directly ---------------------------------------------------------------
def _raw_engine(url: URL | str) -> Engine:
    """A plain engine on the ledger's database, every statement its own snapshot."""
    return create_engine(normalize_url(url), isolation_level="AUTOCOMMIT", pool_size=2, max_overflow=2)


def _in_subtree(queue: str, scope: str) -> bool:
    return queue == scope or queue.startswith(scope + ".")


@dataclass(frozen=True)
class CounterRow:
    scope_type: str
    scope: str
    resource: str
    in_use: int
    reserved: int
    limit: int | None


_U, _R, _I, _J = quota_usages.c, reservations.c, reservation_items.c, quota_journal.c


def _read_counters(conn: Connection) -> dict[CounterKey, CounterRow]:
    """Every counter of the partition, in one statement (one snapshot)."""
    rows = conn.execute(
        select(_U.scope_type, _U.scope, _U.resource, _U.in_use, _U.reserved, _U.hard_limit).where(
            _U.partition == PARTITION
        )
    ).all()
    return {
        (r[0], r[1], r[2]): CounterRow(
            r[0], r[1], r[2], int(r[3]), int(r[4]), None if r[5] is None else int(r[5])
        )
        for r in rows
    }


def _snapshot_problems(counters: Mapping[CounterKey, CounterRow]) -> list[str]:
    """What is wrong with one consistent snapshot of all counters (empty when nothing is)."""
    problems = []
    queue_rows = [c for c in counters.values() if c.scope_type == "queue"]
    for c in counters.values():
        if c.in_use < 0 or c.reserved < 0:
            problems.append(f"negative counter {c}")
        if c.scope_type != "subtree":
            continue
        assert c.limit is not None
        if c.in_use + c.reserved > c.limit:
            problems.append(f"over limit: {c}")
        below = [q for q in queue_rows if q.resource == c.resource and _in_subtree(q.scope, c.scope)]
        sums = (sum(q.in_use for q in below), sum(q.reserved for q in below))
        if (c.in_use, c.reserved) != sums:
            problems.append(f"subtree counter {c} != sum of its queue counters {sums}")
    return problems


def _history(
    conn: Connection, released: Mapping[PairKey, int]
) -> tuple[dict[PairKey, int], dict[PairKey, int]]:
    """(in_use, reserved) per (queue, resource) from the reservation tables and our releases."""

    def sums(column: str, state: str) -> dict[PairKey, int]:
        rows = conn.execute(
            select(_R.queue, _I.resource, func.sum(_I[column]))
            .select_from(reservations.join(reservation_items, _I.reservation_id == _R.id))
            .where(_R.partition == PARTITION, _R.state == state)
            .group_by(_R.queue, _I.resource)
        ).all()
        return {(r[0], r[1]): int(r[2] or 0) for r in rows}

    committed = sums("committed", "committed")
    pending = sums("amount", "pending")
    in_use = dict(committed)
    for pair, amount in released.items():
        in_use[pair] = in_use.get(pair, 0) - amount
    return in_use, pending


def _assert_counters_match_history(conn: Connection, released: Mapping[PairKey, int]) -> None:
    in_use, reserved = _history(conn, released)
    counters = _read_counters(conn)
    assert not _snapshot_problems(counters), _snapshot_problems(counters)
    for pair in {*in_use, *reserved}:
        assert in_use.get(pair, 0) >= 0, (
            f"history says negative in_use for {pair}: more released than committed"
        )
        if in_use.get(pair, 0) or reserved.get(pair, 0):
            assert ("queue", *pair) in counters, f"no queue counter for {pair} although it has usage"
    mismatches = {}
    for key, c in counters.items():
        scope_type, scope, resource = key
        if scope_type == "queue":
            want = (in_use.get((scope, resource), 0), reserved.get((scope, resource), 0))
        else:
            want = (
                sum(v for (q, r), v in in_use.items() if r == resource and _in_subtree(q, scope)),
                sum(v for (q, r), v in reserved.items() if r == resource and _in_subtree(q, scope)),
            )
        if (c.in_use, c.reserved) != want:
            mismatches[key] = {"stored": (c.in_use, c.reserved), "history": want}
    assert mismatches == {}


def _committed_sums(conn: Connection) -> dict[PairKey, int]:
    """Committed amounts per (queue, resource) as the reservation items record them."""
    return {pair: amount for pair, amount in _history(conn, {})[0].items() if amount}


def _released_in_journal(conn: Connection) -> dict[PairKey, int]:
    rows = conn.execute(
        select(_J.queue, _J.resource, func.sum(_J.delta))
        .where(_J.partition == PARTITION, _J.kind == "release")
        .group_by(_J.queue, _J.resource)
    ).all()
    return {(r[0], r[1]): -int(r[2]) for r in rows}


# -- threads -----------------------------------------------------------------------------------
class Crew:
    """Threads whose exceptions are collected and stop everyone, to be re-raised by the test."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.errors: list[str] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            try:
                target()
            except BaseException:  # reported by check()
                with self._lock:
                    self.errors.append(f"{name}:\n{traceback.format_exc()}")
                self.stop.set()

        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def join(self, threads: list[threading.Thread], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
        assert not hung, f"threads did not finish in time (hang or lock wait?): {hung}"

    def check(self) -> None:
        assert not self.errors, "\n".join(self.errors)


# -- 1. many threads on one scope --------------------------------------------------------------
QUEUES = ("root.team.a", "root.team.b")
RESOURCES = ("gpu", "memory")
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


@dataclass
class Outcome:
    """What the test knows about one reservation: the state it last drove it to."""

    queue: str
    resources: dict[str, int]
    short: bool
    state: ReservationState | None = None  # None: left pending (or to the sweeper)
    committed: dict[str, int] | None = None


class Books:
    """The test's own record of everything that succeeded, shared by all workers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: dict[str, Outcome] = {}
        self.releasable: Tally[PairKey] = Tally()  # committed and not yet (being) released
        self.released: Tally[PairKey] = Tally()
        self.committed: Tally[PairKey] = Tally()
        self.stats: Tally[str] = Tally()
        self.gave_up: list[str] = []

    def count(self, what: str) -> None:
        with self.lock:
            self.stats[what] += 1


def _random_request(rng: random.Random) -> dict[str, int]:
    request = {"gpu": rng.randint(1, 4), "memory": rng.randint(10, 60)}
    if rng.random() < 0.25:
        del request[rng.choice(RESOURCES)]
    return request


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
def test_threads_hammering_one_scope_never_exceed_limits(server_db_url: URL) -> None:
    backend = server_db_url.get_backend_name()
    seed = random.randrange(2**32)
    engine = QuotaEngine.from_url(server_db_url, pool_size=24)
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
        print(f"\n[{backend}] seed={seed} stats={stats} retries={retries}")

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
        if backend == "postgresql":
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


# -- 2. connections killed mid-transaction -----------------------------------------------------
KILL_QUEUES = ("root.kill.a", "root.kill.b")
KILL_LIMITS = {"root.kill": {"gpu": 10**6, "memory": 10**7}}  # only the oversized requests are refused
OVERSIZED = {"gpu": 2 * 10**6}


def _kill_postgres(conn: Connection) -> int:
    killed = conn.execute(
        text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    ).scalars()
    return sum(1 for ok in killed if ok)


def _kill_mariadb(conn: Connection) -> int:
    ids = (
        conn.execute(
            text(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
        )
        .scalars()
        .all()
    )
    killed = 0
    for pid in ids:
        try:
            conn.execute(text(f"KILL CONNECTION {int(pid)}"))
        except exc.DBAPIError:
            continue  # gone already (1094 unknown thread id)
        killed += 1
    return killed


def _persist(books: Books, call: Callable[[], T], what: str, deadline: float) -> T:
    """Call until it does not raise DatabaseUnavailable: what a caller does after an outage."""
    while True:
        try:
            return call()
        except DatabaseUnavailable:
            books.count(f"unavailable_{what}")
            assert time.monotonic() < deadline, f"{what} kept failing with DatabaseUnavailable"
        except QuotaLedgerError as error:
            if type(error) is not QuotaLedgerError:
                raise  # a domain error (OverQuota, ...): the caller decides
            # The generic "database error": a caller cannot tell that retrying is safe.
            raise AssertionError(
                f"{what}: a killed connection surfaced as {error!r} (cause: {error.__cause__!r}), "
                "not as DatabaseUnavailable"
            ) from error


@dataclass
class Keyed:
    key: str
    queue: str
    resources: dict[str, int]
    id: str | None = None  # None: refused (OverQuota), so no reservation may exist
    state: ReservationState | None = None
    committed: dict[str, int] | None = None


def _keyed_worker(
    engine: QuotaEngine,
    books: Books,
    wid: int,
    rng: random.Random,
    deadline: float,
    stop: threading.Event,
    log: dict[str, Keyed],
) -> None:
    give_up = deadline + 25.0
    n = 0
    # At least one round of every outcome per worker, even on a slow machine (bounded all the same).
    while not stop.is_set() and (time.monotonic() < deadline or n < 5) and time.monotonic() < deadline + 15:
        n += 1
        # Every worker cycles through all outcomes, so each shows up even in a slow run.
        action = ("oversized", "commit", "partial", "rollback", "leave")[n % 5]
        request = dict(OVERSIZED) if action == "oversized" else _random_request(rng)
        entry = Keyed(f"w{wid}-k{n}", rng.choice(KILL_QUEUES), request)
        with books.lock:
            log[entry.key] = entry
        _drive_key(engine, books, entry, action, rng, give_up)


def _drive_key(
    engine: QuotaEngine, books: Books, entry: Keyed, action: str, rng: random.Random, give_up: float
) -> None:
    """Reserve with a key, then commit (fully or partly), roll back or leave it, retrying outages."""

    def reserve() -> Reservation:
        return engine.reserve(entry.queue, entry.resources, key=entry.key)

    try:
        r = _persist(books, reserve, "reserve", give_up)
    except OverQuota:
        assert action == "oversized", f"{entry.key}: refused although the limit has room"
        books.count("refused")
        return
    assert action != "oversized", f"{entry.key}: {entry.resources} reserved beyond the limit"
    assert (r.key, r.queue, r.resources) == (entry.key, entry.queue, entry.resources)
    entry.id, entry.state = r.id, r.state
    books.count("reserved")
    if rng.random() < 0.5:  # a client that lost the answer asks again with the same key
        again = _persist(books, reserve, "reserve", give_up)
        assert again.id == r.id, f"key {entry.key}: second call returned another reservation"
        books.count("rereserved")
    want: dict[str, int] | None
    if action == "commit":
        done = _persist(books, lambda: engine.commit(r.id), "commit", give_up)
        want = dict(r.resources)
    elif action == "partial":
        partial = {res: rng.randint(0, amount) for res, amount in r.resources.items()}
        done = _persist(books, lambda: engine.commit(r.id, partial), "commit", give_up)
        want = partial
    elif action == "rollback":
        done = _persist(books, lambda: engine.rollback(r.id), "rollback", give_up)
        want = None
    else:
        books.count("left_pending")
        return
    if want is None:
        assert done.state is ReservationState.ROLLED_BACK, done
    else:
        assert done.state is ReservationState.COMMITTED, done
        assert done.committed == want, (entry.key, done.committed, want)
        with books.lock:
            for res, amount in want.items():
                books.committed[(r.queue, res)] += amount
    entry.state, entry.committed = done.state, done.committed
    books.count(done.state.value)
    if rng.random() < 0.3:  # the key still names the same, now resolved, reservation
        again = _persist(books, reserve, "reserve", give_up)
        assert (again.id, again.state) == (r.id, done.state), (entry.key, again)


def _killer(url: URL, kill: Callable[[Connection], int], deadline: float, crew: Crew, books: Books) -> None:
    """Kill every connection of the test database at random intervals until the deadline."""
    rng = random.Random(7)
    admin = _raw_engine(url)
    try:
        with admin.connect() as conn:
            while not crew.stop.is_set() and time.monotonic() < deadline:
                killed = kill(conn)
                with books.lock:
                    books.stats["kills"] += killed
                    books.stats["kill_rounds"] += 1
                crew.stop.wait(rng.uniform(0.05, 0.3))
    finally:
        admin.dispose()


@pytest.mark.slow
def test_killed_connections_lose_and_double_nothing(server_db_url: URL) -> None:
    """PostgreSQL: pg_terminate_backend; MariaDB: KILL CONNECTION. Same checks on both."""
    backend = server_db_url.get_backend_name()
    kill = _kill_postgres if backend == "postgresql" else _kill_mariadb
    seed = random.randrange(2**32)
    engine = QuotaEngine.from_url(server_db_url, pool_size=24)
    # Far fewer retries than the default 10, so that callers do see DatabaseUnavailable and have to
    # retry themselves, which is what the idempotency key is for.
    engine.driver.max_attempts = 2
    raw = _raw_engine(server_db_url)
    try:
        engine.set_limits("root.kill", KILL_LIMITS["root.kill"])
        books = Books()
        crew = Crew()
        log: dict[str, Keyed] = {}
        deadline = time.monotonic() + _DURATION
        workers = [
            crew.spawn(
                f"keyed-{i}",
                functools.partial(
                    _keyed_worker, engine, books, i, random.Random(seed + i), deadline, crew.stop, log
                ),
            )
            for i in range(8)
        ]
        # Kills stop at the deadline, so that the operations then in flight can finish.
        killer = crew.spawn("killer", lambda: _killer(server_db_url, kill, deadline, crew, books))
        crew.join(workers, _DURATION + _JOIN_GRACE + 30.0)
        crew.stop.set()
        crew.join([killer], _JOIN_GRACE)
        crew.check()
        stats, retries = dict(books.stats), dict(engine.driver.retries)
        print(f"\n[{backend}] seed={seed} stats={stats} retries={retries}")

        assert stats.get("kills", 0) > 0, stats
        assert retries.get("disconnect", 0) > 0, f"no transaction was interrupted: {retries}"
        assert any(k.startswith("unavailable_") for k in stats), f"no caller saw DatabaseUnavailable: {stats}"
        for what in ("reserved", "refused", "committed", "rolled_back", "rereserved"):
            assert stats.get(what, 0) > 0, f"no {what!r} happened: {stats}"

        with raw.connect() as conn:
            doubled = conn.execute(
                select(_R.partition, _R.key, func.count())
                .group_by(_R.partition, _R.key)
                .having(func.count() > 1)
            ).all()
            assert doubled == []
            rows = conn.execute(
                select(_R.id, _R.key, _R.state, _I.resource, _I.committed).select_from(
                    reservations.join(reservation_items, _I.reservation_id == _R.id)
                )
            ).all()
            stored: dict[str, tuple[str, ReservationState, dict[str, int | None]]] = {}
            for rid, key, state, res, committed in rows:
                stored.setdefault(key, (rid, ReservationState(state), {}))[2][res] = committed
            assert None not in stored, "a reservation without the key its caller gave"
            expected = {k: e for k, e in log.items() if e.id is not None}
            assert stored.keys() == expected.keys(), {
                "stored, never returned": sorted(stored.keys() - expected.keys())[:10],
                "returned, not stored": sorted(expected.keys() - stored.keys())[:10],
            }
            for key, entry in expected.items():
                rid, state, items = stored[key]
                assert rid == entry.id, f"key {key}: stored {rid}, caller got {entry.id}"
                assert state is entry.state, (key, state, entry)
                if state is ReservationState.COMMITTED:
                    assert items == entry.committed, (key, items, entry.committed)
            assert engine.audit() == []
            _assert_counters_match_history(conn, {})
            assert _committed_sums(conn) == {p: a for p, a in books.committed.items() if a}
    finally:
        raw.dispose()
        engine.close()


# -- 3. SQLite shared by processes -------------------------------------------------------------
_CHILD = textwrap.dedent(
    """
    import json, random, sys, time
    from quota_ledger import OverQuota, QuotaEngine

    url, attempts = sys.argv[1], int(sys.argv[2])
    engine = QuotaEngine.from_url(url)
    engine.usage("root")  # connect before the start signal
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)
    ids, refused = [], 0
    for n in range(attempts):
        time.sleep(random.uniform(0, 0.003))  # a client's think time, so the processes interleave
        try:
            r = engine.reserve(("root.team.a", "root.team.b")[n % 2], {"gpu": 2, "memory": 1})
        except OverQuota:
            refused += 1
            continue
        ids.append(r.id)
        if len(ids) % 2:
            engine.commit(r.id)  # still counts against the limit, now as in use
    print(json.dumps({"ids": ids, "refused": refused, "retries": dict(engine.driver.retries)}), flush=True)
    engine.close()
    """
)


def test_sqlite_processes_share_one_tight_limit(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    url = f"sqlite:///{path}"
    limit, amount, processes, attempts = 40, 2, 4, 25
    with QuotaEngine.from_url(url) as engine:
        engine.migrate()
        engine.set_limits("root.team", {"gpu": limit})
    assert processes * attempts * amount > limit  # demand exceeds the limit

    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, url, str(attempts)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    results: list[dict[str, Any]] = []
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.strip() == "ready", (line, child.stderr.read() if child.stderr else "")
        for child in children:  # start together: all are connected and waiting
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()

    ids = [rid for r in results for rid in r["ids"]]
    per_process = [len(r["ids"]) for r in results]
    print(f"\n[sqlite] reservations per process: {per_process}, retries: {[r['retries'] for r in results]}")
    assert sum(1 for count in per_process if count) >= 2, f"the processes did not interleave: {per_process}"
    assert len(ids) == len(set(ids))
    assert len(ids) == limit // amount, (
        f"{len(ids)} reservations succeeded against room for {limit // amount}"
    )
    assert sum(r["refused"] for r in results) == processes * attempts - limit // amount

    with QuotaEngine.from_url(url) as engine:
        assert engine.audit() == []
        team = engine.usage("root.team")["gpu"]
        assert team.in_use + team.reserved == limit
        assert team.limit == limit
        assert team.in_use == amount * sum((len(r["ids"]) + 1) // 2 for r in results)
    raw = create_engine(url)
    try:
        with raw.connect() as conn:
            assert (
                conn.execute(select(func.count()).select_from(reservations)).scalar_one() == limit // amount
            )
            _assert_counters_match_history(conn, {})
    finally:
        raw.dispose()
