"""What the concurrency tests share: the ledger's tables read directly and checked against their
own history, a crew of threads that stop together, and the books of what succeeded.

The checks compute the counters from the reservation tables, independently of the library's audit.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import Counter as Tally
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, create_engine, func, select
from sqlalchemy.engine import URL

from quota_ledger import ReservationState
from quota_ledger.driver.dialect import normalize_url
from quota_ledger.driver.schema import quota_journal, quota_usages, reservation_items, reservations

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


# -- what the load did ----------------------------------------------------------------------------
RESOURCES = ("gpu", "memory")


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
