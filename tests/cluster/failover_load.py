"""Reservations under load while a database server may die, and the callers' log of what was
acknowledged.

``threads`` workers reserve on a hot queue they all share (``root.hot``) and on a cold queue of
their own (``root.cold.tN``, under ``root.cold``), with limits small enough that the hot queue,
the cold queues and their parent all refuse some requests. Each reservation has an idempotency
key; most are committed, some rolled back, and a worker holds a few committed ones and releases
the oldest, so the load runs for as long as it is asked. An operation that fails with
:class:`DatabaseUnavailable` (the driver gave up retrying) is sent again, same key or id, until
it is answered or the load stops: the log keeps, per key, the state the last acknowledged
operation left the reservation in. Every other exception is counted by type, and an exception
that is not a :class:`QuotaLedgerError` is one the library should never let through.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg

from quota_ledger import DatabaseUnavailable, OverQuota, QuotaEngine, QuotaLedgerError, Reservation

T = TypeVar("T")

HOT = "root.hot"
COLD = "root.cold"
RESOURCE = "fpga"
#: committed reservations a worker holds before it releases the oldest
HOLD = 3
#: share of reservations rolled back instead of committed
ROLLBACK_SHARE = 0.2
#: share of reservations on the hot queue
HOT_SHARE = 0.5
#: long enough that no reservation of a run expires
TTL = 3600

#: acknowledged states, as :class:`~quota_ledger.ReservationState` values (released: committed
#: and then released)
PENDING, COMMITTED, ROLLED_BACK, RELEASED = "pending", "committed", "rolled_back", "released"


def cold_queue(thread: int) -> str:
    return f"{COLD}.t{thread}"


def limits(threads: int) -> dict[str, int]:
    """The ``fpga`` limit of every queue the load uses: each one binds now and then."""
    made = {HOT: 5 * threads, COLD: 6 * threads}
    made.update({cold_queue(t): 12 for t in range(threads)})
    return made


def prepare(engine: QuotaEngine, threads: int) -> None:
    for queue, limit in limits(threads).items():
        engine.set_limits(queue, {RESOURCE: limit})


@dataclass
class Acked:
    """One idempotency key and what its caller was told last."""

    queue: str
    amount: int
    reservation_id: str = ""
    state: str = PENDING
    #: the state an operation sent but never answered (the load stopped) may have left it in
    maybe: str = ""
    #: a later answer that contradicts an earlier one: what was lost
    contradicted: str = ""


@dataclass
class Tally:
    """What a run did; merged from every worker when the load stops."""

    acked: dict[str, Acked] = field(default_factory=dict)
    #: operations answered, by kind (reserve, commit, rollback, release)
    done: Counter[str] = field(default_factory=Counter)
    #: exceptions by class name; ``untyped:`` ones are not QuotaLedgerErrors
    errors: Counter[str] = field(default_factory=Counter)
    #: (finished at, seconds taken) of every answered operation, refusals included
    answers: list[tuple[float, float]] = field(default_factory=list)
    #: (started at, finished at) of every answered operation
    spans: list[tuple[float, float]] = field(default_factory=list)

    def merge(self, other: Tally) -> None:
        self.acked.update(other.acked)
        self.done.update(other.done)
        self.errors.update(other.errors)
        self.answers.extend(other.answers)
        self.spans.extend(other.spans)

    @property
    def untyped(self) -> int:
        return sum(n for name, n in self.errors.items() if name.startswith("untyped:"))


class Load:
    """``start`` the workers on ``engine``, ``stop`` them; :attr:`tally` is what they did."""

    def __init__(
        self, engine: QuotaEngine, threads: int, *, seed: int = 0, retry_pause: float = 0.05
    ) -> None:
        self.engine = engine
        self.threads = threads
        self.seed = seed
        self.retry_pause = retry_pause
        self.tally = Tally()
        #: when the latest operation answered so far was sent (monotonic clock)
        self.latest_start = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []

    def start(self) -> None:
        for n in range(self.threads):
            worker = threading.Thread(target=self._work, args=(n,), name=f"load-{n}", daemon=True)
            self._workers.append(worker)
            worker.start()

    def stop(self, timeout: float = 60) -> Tally:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout)
        stuck = [w.name for w in self._workers if w.is_alive()]
        if stuck:
            raise AssertionError(f"load workers still running {timeout:.0f} s after stop: {stuck}")
        return self.tally

    def _work(self, thread: int) -> None:
        rng = random.Random(self.seed * 1000 + thread)
        mine = Tally()
        held: list[str] = []  # keys of committed reservations, oldest first
        try:
            n = 0
            while not self._stop.is_set():
                n += 1
                key = f"t{thread}-{n}"
                queue = HOT if rng.random() < HOT_SHARE else cold_queue(thread)
                self._one(mine, held, key, Acked(queue=queue, amount=rng.randint(1, 3)), rng)
        finally:
            with self._lock:
                self.tally.merge(mine)

    def _one(self, mine: Tally, held: list[str], key: str, entry: Acked, rng: random.Random) -> None:
        engine = self.engine
        made = self._answer(
            mine,
            "reserve",
            lambda: engine.reserve(entry.queue, {RESOURCE: entry.amount}, key=key, ttl=TTL),
        )
        if made is None:  # refused, given up or stopped: nothing to resolve
            if held:
                self._release(mine, held)
            return
        entry.reservation_id, entry.state = made.id, PENDING
        mine.acked[key] = entry
        if rng.random() < ROLLBACK_SHARE:
            self._resolve(mine, entry, ROLLED_BACK, lambda: engine.rollback(made.id))
            return
        if self._resolve(mine, entry, COMMITTED, lambda: engine.commit(made.id)):
            held.append(key)
        if len(held) > HOLD:
            self._release(mine, held)

    def _release(self, mine: Tally, held: list[str]) -> None:
        entry = mine.acked[held.pop(0)]
        if entry.state != COMMITTED:
            return
        ident = entry.reservation_id
        self._resolve(mine, entry, RELEASED, lambda: self.engine.release_reservation(ident))

    def _resolve(self, mine: Tally, entry: Acked, state: str, call: Callable[[], Reservation]) -> bool:
        """Move an acknowledged reservation on to ``state``; whether that was acknowledged.

        The answer's state is what the caller is told: a commit found already rolled back
        (expired, or a release that found it still pending) means an earlier acknowledgement
        was lost, and the log says so."""
        kind = {ROLLED_BACK: "rollback", COMMITTED: "commit", RELEASED: "release"}[state]
        answer = self._answer(mine, kind, call)
        if answer is None:
            if self._stop.is_set():
                entry.maybe = state
            return False
        told = RELEASED if answer.released_at is not None else answer.state.value
        if told != state:
            entry.contradicted = f"acknowledged {entry.state}, then {kind} answered {told}"
        entry.state = told
        return told == state

    def _answer(self, mine: Tally, kind: str, call: Callable[[], T]) -> T | None:
        """``call()`` until it is answered: its result, or None when it was refused, failed for
        good or the load stopped first (then the operation is in doubt)."""
        while True:
            started = time.monotonic()
            try:
                result = call()
            except DatabaseUnavailable as error:
                mine.errors[type(error).__name__] += 1
                if self._stop.wait(self.retry_pause):
                    return None
                continue
            except OverQuota as error:
                self._record(mine, f"{kind} refused", started)
                mine.errors[type(error).__name__] += 1
                return None
            except QuotaLedgerError as error:  # e.g. an acknowledged reservation that was lost
                mine.errors[type(error).__name__] += 1
                return None
            except Exception as error:  # counted: the library must not let these through
                mine.errors[f"untyped:{type(error).__name__}"] += 1
                return None
            self._record(mine, kind, started)
            return result

    def _record(self, mine: Tally, kind: str, started: float) -> None:
        now = time.monotonic()
        self.latest_start = max(self.latest_start, started)  # racy by a few ms at worst
        mine.done[kind] += 1
        mine.answers.append((now, now - started))
        mine.spans.append((started, now))


def lost(url: str, acked: dict[str, Acked]) -> dict[str, str]:
    """Keys whose acknowledged state the database at ``url`` does not hold: key -> what the
    caller was told and what the row says (read in one statement, not through the engine)."""
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT key, id, state, released_at IS NOT NULL FROM reservations WHERE key IS NOT NULL"
        ).fetchall()
    found = {key: (ident, RELEASED if released else state) for key, ident, state, released in rows}
    missing = {key: entry.contradicted for key, entry in acked.items() if entry.contradicted}
    for key, entry in acked.items():
        ident, state = found.get(key, ("", "no row"))
        if key not in missing and (ident != entry.reservation_id or state not in (entry.state, entry.maybe)):
            missing[key] = f"acknowledged {entry.state}, found {state}"
    return missing


class OverLimitSampler:
    """Reads every limited counter of one server every ``every`` seconds on a thread of its own,
    counting the counters over their limit (``in_use + reserved > hard_limit``) in each sample.
    A server that does not answer is a failed sample, and the sampler tries again."""

    QUERY = (
        "SELECT count(*), count(*) FILTER (WHERE in_use + reserved > hard_limit)"
        " FROM quota_usages WHERE hard_limit IS NOT NULL"
    )

    def __init__(self, url: str, every: float = 0.1) -> None:
        self.url = url.replace("+psycopg", "")
        self.every = every
        self.samples = 0
        self.failed = 0
        #: samples that found a counter over its limit, and the counters found over it
        self.violations = 0
        self.over = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        conn: psycopg.Connection[tuple[int, int]] | None = None
        while not self._stop.wait(self.every):
            try:
                if conn is None:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=1)
                row = conn.execute(self.QUERY).fetchone()
            except psycopg.Error:
                self.failed += 1
                if conn is not None:
                    conn.close()
                conn = None
                continue
            assert row is not None
            self.samples += 1
            if row[1]:
                self.violations += 1
                self.over += row[1]
        if conn is not None:
            conn.close()
