"""Connections killed mid-transaction on PostgreSQL and MariaDB, callers retrying what failed.

What must hold: a retried call with an idempotency key returns the original reservation, never a
second one; every reservation a caller was given is stored as the caller last saw it, and no other;
the counters equal what the tables' history says and :meth:`QuotaEngine.audit` agrees.

The test bounds its own run time (``_DURATION`` seconds of load plus setup and checks).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest
from concurrent_load import (
    _DURATION,
    _I,
    _JOIN_GRACE,
    _R,
    Books,
    Crew,
    _assert_counters_match_history,
    _committed_sums,
    _random_request,
    _raw_engine,
)
from sqlalchemy import Connection, exc, func, select, text
from sqlalchemy.engine import URL

from quota_ledger import (
    DatabaseUnavailable,
    OverQuota,
    QuotaEngine,
    QuotaLedgerError,
    Reservation,
    ReservationState,
)
from quota_ledger.driver.schema import reservation_items, reservations

T = TypeVar("T")


# -- connections killed mid-transaction -----------------------------------------------------
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
@pytest.mark.parametrize("batching", [False, True], ids=["per-call", "batching"])
def test_killed_connections_lose_and_double_nothing(server_db_url: URL, batching: bool) -> None:
    """PostgreSQL: pg_terminate_backend; MariaDB: KILL CONNECTION. Same checks on both."""
    backend = server_db_url.get_backend_name()
    kill = _kill_postgres if backend == "postgresql" else _kill_mariadb
    seed = random.randrange(2**32)
    engine = QuotaEngine.from_url(server_db_url, pool_size=24, batching=batching)
    # Far fewer retries than the default 10, so that callers do see DatabaseUnavailable and have to
    # retry themselves, which is what the idempotency key is for. Half the workers share an engine
    # that never retries: whether two kills in a row meet one operation of the other engine is
    # chance (one batch transaction at a time is a small target), while every kill that meets an
    # operation of this one reaches its caller.
    engine.driver.max_attempts = 2
    impatient = QuotaEngine.from_url(server_db_url, pool_size=24, batching=batching)
    impatient.driver.max_attempts = 1
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
                    _keyed_worker,
                    (engine, impatient)[i % 2],
                    books,
                    i,
                    random.Random(seed + i),
                    deadline,
                    crew.stop,
                    log,
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
        print(
            f"\n[{backend}] seed={seed} stats={stats} retries={retries} "
            f"batches={engine.batch_stats} {impatient.batch_stats}"
        )

        assert stats.get("kills", 0) > 0, stats
        if batching:
            assert engine.batch_stats.requests > engine.batch_stats.batches > 0, engine.batch_stats
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
        impatient.close()
        engine.close()
