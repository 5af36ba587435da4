"""Client threads that reserve and commit on the ledger while a server may die, recording every
operation the ledger acknowledged.

Each client loops: pick a queue (one of a few *hot* queues, or one of the *cold* ones under
``root.load.cold``, whose parent may have a limit of its own), ``reserve`` a few ``fpga`` with an
idempotency key, then roll it back (a share of the time) or commit it. A client holds a few
committed reservations and releases the oldest (``release_reservation``) when it holds more, so
usage stays near the limits and :class:`OverQuota` refusals are part of the load. A call that
fails with :class:`DatabaseUnavailable` (the driver's retry budget spent, e.g. during a
failover) is made again with the same key or id, so a reservation made by an attempt whose
answer was lost is found, not made twice: until it is answered or the load stops, or at most
``Shape.again`` more times.

What the ledger acknowledged is recorded per reservation as an :class:`Ack`: the state the last
answered operation left it in, the state an unanswered one may have left it in, and an answer
that contradicts an earlier one (a commit answered "rolled back": an acknowledgement was lost).
:func:`lost` compares the acknowledgements with a server's rows. Errors are counted by class;
anything that is not a :class:`QuotaLedgerError` is kept as ``unexpected`` (a failure).
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from quota_ledger import DatabaseUnavailable, OverQuota, QuotaEngine, QuotaLedgerError, Reservation

T = TypeVar("T")

#: the driver's retry budget the cluster's engines are given
RETRY_ATTEMPTS = 10
RETRY_SECONDS = 15.0
#: long enough that no reservation of a run expires
TTL = 3600

#: what a caller is told a reservation is (a :class:`~quota_ledger.ReservationState` value, or
#: released: committed and then released)
PENDING, COMMITTED, ROLLED_BACK, RELEASED = "pending", "committed", "rolled_back", "released"


def connect(urls: Sequence[str]) -> QuotaEngine:
    """An engine on the nodes ``urls``, the writer candidates in order of preference."""
    return QuotaEngine.from_url(list(urls), retry_attempts=RETRY_ATTEMPTS, retry_seconds=RETRY_SECONDS)


@dataclass(frozen=True, kw_only=True)
class Shape:
    """What the clients do."""

    threads: int = 6
    hot_queues: int = 2
    cold_queues: int = 30
    hot_limit: int = 6
    cold_limit: int = 4
    #: the limit of ``root.load.cold``, the cold queues' parent (None: none)
    cold_parent_limit: int | None = None
    #: a reservation takes 1 to this many ``fpga``
    most: int = 1
    hot_share: float = 0.5
    rollback_share: float = 0.15
    #: committed reservations a client holds before it releases its oldest
    hold: int = 3
    #: times a call that met DatabaseUnavailable is made again before the client moves on
    #: (None: until it is answered or the load stops)
    again: int | None = 3
    #: seconds between two tries of a call that met DatabaseUnavailable
    pause: float = 0.0

    def hot(self) -> list[str]:
        return [f"root.load.hot{i}" for i in range(self.hot_queues)]

    def cold(self) -> list[str]:
        return [f"root.load.cold.c{i}" for i in range(self.cold_queues)]

    def limits(self) -> dict[str, int]:
        """The ``fpga`` limit of every queue the load uses."""
        made = dict.fromkeys(self.hot(), self.hot_limit)
        if self.cold_parent_limit is not None:
            made["root.load.cold"] = self.cold_parent_limit
        made.update(dict.fromkeys(self.cold(), self.cold_limit))
        return made


def prepare(engine: QuotaEngine, shape: Shape) -> None:
    """The queues' limits (and so their counters), set through ``engine``."""
    for queue, limit in shape.limits().items():
        engine.set_limits(queue, {"fpga": limit})


@dataclass(kw_only=True)
class Ack:
    """What the ledger told a caller about one reservation."""

    id: str
    key: str
    queue: str
    state: str = PENDING
    #: the state an operation sent but never answered may have left it in
    maybe: str = ""
    #: a later answer that contradicts an earlier one: what was lost
    contradicted: str = ""


@dataclass(kw_only=True)
class LoadResult:
    seconds: float = 0.0
    acks: dict[str, Ack] = field(default_factory=dict)  # by reservation id
    pairs: int = 0  # reserve + commit, both acknowledged
    refused: int = 0  # OverQuota
    done: Counter[str] = field(default_factory=Counter)  # operations answered, by kind, refusals included
    errors: Counter[str] = field(default_factory=Counter)  # QuotaLedgerError subclasses but OverQuota
    unexpected: list[str] = field(default_factory=list)  # anything else: a failure
    latency: dict[str, list[float]] = field(default_factory=lambda: {"reserve": [], "commit": []})
    spans: list[tuple[float, float]] = field(default_factory=list)  # (sent, answered) of every answer
    retries: Counter[str] = field(default_factory=Counter)  # the engines' driver retries, by cause

    @property
    def throughput(self) -> float:
        return self.pairs / self.seconds if self.seconds else 0.0

    def percentile(self, kind: str, share: float) -> float:
        """The ``share`` (0..1) quantile of ``kind``'s latencies, in milliseconds."""
        values = sorted(self.latency[kind])
        if not values:
            return float("nan")
        return 1000 * values[min(len(values) - 1, int(share * len(values)))]

    def latencies(self) -> str:
        """p50, p99 and max of reserve and commit (with the driver's retries), in milliseconds."""
        return ", ".join(
            f"{kind} p50 {self.percentile(kind, 0.5):.1f} ms p99 {self.percentile(kind, 0.99):.1f} ms "
            f"max {self.percentile(kind, 1.0):.0f} ms"
            for kind in ("reserve", "commit")
        )

    def first_answer_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` (monotonic) to the first answer of an operation sent after it."""
        later = [answered for sent, answered in self.spans if sent >= moment]
        return min(later) - moment if later else None

    def summary(self) -> str:
        return (
            f"{self.pairs} pairs in {self.seconds:.1f} s ({self.throughput:.0f}/s), {self.latencies()}, "
            f"{self.refused} refused, errors {dict(self.errors)}, unexpected {len(self.unexpected)}, "
            f"retries {dict(self.retries)}"
        )

    def merge(self, other: LoadResult) -> None:
        self.acks.update(other.acks)
        self.pairs += other.pairs
        self.refused += other.refused
        self.done.update(other.done)
        self.errors.update(other.errors)
        self.unexpected += other.unexpected
        for kind, values in other.latency.items():
            self.latency[kind] += values
        self.spans += other.spans


class Load:
    """``shape.threads`` clients; client ``i`` calls ``engines[i % len(engines)]``."""

    def __init__(
        self, engines: Sequence[QuotaEngine], shape: Shape, *, name: str = "c", seed: int = 7
    ) -> None:
        self.engines = list(engines)
        self.shape = shape
        self.name = name
        self.seed = seed
        self.result = LoadResult()
        #: when the latest operation answered so far was sent (monotonic clock; racy by a few ms)
        self.latest_sent = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._started = 0.0
        self._retries_before = [Counter(e.driver.retries) for e in self.engines]

    def start(self) -> Load:
        self._started = time.monotonic()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), name=f"{self.name}{i}", daemon=True)
            for i in range(self.shape.threads)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 60) -> LoadResult:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
            if thread.is_alive():
                self.result.unexpected.append(f"{thread.name} still running {timeout:.0f} s after stop")
        self.result.seconds = time.monotonic() - self._started
        for engine, before in zip(self.engines, self._retries_before, strict=True):
            self.result.retries.update(Counter(engine.driver.retries) - before)
        return self.result

    # -- one client --------------------------------------------------------------------------
    def _client(self, index: int) -> None:
        engine = self.engines[index % len(self.engines)]
        rng = random.Random(self.seed * 1000 + index)
        hot, cold = self.shape.hot(), self.shape.cold()
        local = LoadResult()
        held: list[Ack] = []  # committed, oldest first
        sequence = 0
        try:
            while not self._stop.is_set():
                sequence += 1
                queue = rng.choice(hot) if rng.random() < self.shape.hot_share else rng.choice(cold)
                key = f"{self.name}{index}-{sequence}"
                amount = rng.randint(1, self.shape.most)
                reserve = partial(engine.reserve, queue, {"fpga": amount}, key=key, ttl=TTL)
                made, _ = self._call(local, "reserve", reserve)
                if made is None:  # refused, given up or stopped: nothing to resolve
                    continue
                ack = Ack(id=made.id, key=key, queue=queue)
                local.acks[made.id] = ack
                if rng.random() < self.shape.rollback_share:
                    self._resolve(local, ack, ROLLED_BACK, partial(engine.rollback, made.id))
                    continue
                if not self._resolve(local, ack, COMMITTED, partial(engine.commit, made.id)):
                    continue
                local.pairs += 1
                held.append(ack)
                if len(held) > self.shape.hold:
                    oldest = held.pop(0)
                    self._resolve(local, oldest, RELEASED, partial(engine.release_reservation, oldest.id))
        except BaseException:  # a client must never die quietly
            local.unexpected.append(f"client {index} died: {traceback.format_exc()}")
        with self._lock:
            self.result.merge(local)

    def _resolve(self, local: LoadResult, ack: Ack, state: str, call: Callable[[], Reservation]) -> bool:
        """Move an acknowledged reservation on to ``state``; whether that was acknowledged.

        The answer's state is what the caller is told: a commit found already rolled back means
        an earlier acknowledgement was lost, and the ack says so."""
        kind = {ROLLED_BACK: "rollback", COMMITTED: "commit", RELEASED: "release"}[state]
        answer, doubt = self._call(local, kind, call)
        if answer is None:
            if doubt:
                ack.maybe = state
            return False
        told = RELEASED if answer.released_at is not None else answer.state.value
        if told != state:
            ack.contradicted = f"acknowledged {ack.state}, then {kind} answered {told}"
        ack.state = told
        return told == state

    def _call(self, local: LoadResult, kind: str, call: Callable[[], T]) -> tuple[T | None, bool]:
        """``call()`` with its answer recorded: its result (None when it was refused or failed),
        and whether it is in doubt (unanswered: it may have happened)."""
        tries = 0
        while True:
            tries += 1
            sent = time.monotonic()
            try:
                value = call()
            except OverQuota:
                local.refused += 1
                self._answered(local, f"{kind} refused", sent)
                return None, False
            except DatabaseUnavailable:
                local.errors["DatabaseUnavailable"] += 1
                again = self.shape.again
                if self._stop.wait(self.shape.pause) or (again is not None and tries > again):
                    return None, True
                continue
            except QuotaLedgerError as error:
                local.errors[type(error).__name__] += 1
                return None, False
            except Exception as error:
                local.unexpected.append(f"{kind}: {type(error).__name__}: {error}")
                return None, True
            answered = self._answered(local, kind, sent)
            if kind in local.latency:
                local.latency[kind].append(answered - sent)
            return value, False

    def _answered(self, local: LoadResult, kind: str, sent: float) -> float:
        answered = time.monotonic()
        self.latest_sent = max(self.latest_sent, sent)
        local.done[kind] += 1
        local.spans.append((sent, answered))
        return answered


#: a reservation's row as a server holds it: (key, state, released)
Stored = tuple[str, str, bool]


def lost(where: str, stored: Mapping[str, Stored], acks: Mapping[str, Ack]) -> list[str]:
    """Every acknowledged operation the rows ``stored`` (by reservation id) of server ``where``
    do not show, and every acknowledgement a later answer contradicted (empty: none lost)."""
    found: list[str] = []
    for ack in acks.values():
        if ack.contradicted:
            found.append(f"{where}: {ack.id} ({ack.key}) {ack.contradicted}")
            continue
        row = stored.get(ack.id)
        if row is None:
            found.append(f"{where}: {ack.state} reservation {ack.id} ({ack.key}) is missing")
            continue
        key, state, released = row
        holds = RELEASED if released else state
        if key != ack.key or holds not in (ack.state, ack.maybe):
            found.append(f"{where}: {ack.id} ({ack.key}) acknowledged {ack.state}, stored {row}")
    return found
