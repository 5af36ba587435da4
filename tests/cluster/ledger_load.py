"""Client threads that reserve and commit on the ledger, recording every acknowledged operation.

Each client loops: pick a queue (one of a few *hot* queues with small limits, or one of many
*cold* ones), ``reserve`` one ``fpga`` with an idempotency key, then roll it back (a share of
the time) or commit it. A client holds a few committed reservations and releases the oldest
(``release_reservation``) when it holds more, so usage stays near the hot queues' limits and
``OverQuota`` refusals are part of the load. A call that fails with :class:`DatabaseUnavailable`
(the driver's retry budget spent, e.g. during a failover) is made again: ``reserve`` with the
same key, so a reservation made by an attempt whose answer was lost is found, not made twice.

What the ledger acknowledged (a call that returned) is recorded per reservation as
:class:`Ack`; :mod:`ledger_checks` compares it with the rows on every node. Errors are counted by
class; anything that is not a :class:`QuotaLedgerError` is kept as ``unexpected`` (a failure).
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from quota_ledger import DatabaseUnavailable, OverQuota, QuotaEngine, QuotaLedgerError

T = TypeVar("T")

#: the driver's retry budget the cluster's engines are given
RETRY_ATTEMPTS = 10
RETRY_SECONDS = 15.0


def connect(urls: Sequence[str]) -> QuotaEngine:
    """An engine on the Galera nodes ``urls``, the writer candidates in order of preference."""
    return QuotaEngine.from_url(list(urls), retry_attempts=RETRY_ATTEMPTS, retry_seconds=RETRY_SECONDS)


@dataclass(frozen=True, kw_only=True)
class Shape:
    """What the clients do."""

    threads: int = 6
    hot_queues: int = 2
    cold_queues: int = 30
    hot_limit: int = 6
    cold_limit: int = 4
    hot_share: float = 0.5
    rollback_share: float = 0.15
    #: committed reservations a client holds before it releases its oldest
    hold: int = 3
    #: times a call that met DatabaseUnavailable is made again before the client moves on
    again: int = 3

    def hot(self) -> list[str]:
        return [f"root.load.hot{i}" for i in range(self.hot_queues)]

    def cold(self) -> list[str]:
        return [f"root.load.cold{i}" for i in range(self.cold_queues)]


def prepare(engine: QuotaEngine, shape: Shape) -> None:
    """The queues' limits (and so their counters), set through ``engine``."""
    for queue in shape.hot():
        engine.set_limits(queue, {"fpga": shape.hot_limit})
    for queue in shape.cold():
        engine.set_limits(queue, {"fpga": shape.cold_limit})


@dataclass(kw_only=True)
class Ack:
    """The last state the ledger acknowledged for one reservation."""

    id: str
    key: str
    queue: str
    state: str  # pending, committed, rolled_back, released


@dataclass(kw_only=True)
class LoadResult:
    seconds: float = 0.0
    acks: dict[str, Ack] = field(default_factory=dict)
    pairs: int = 0  # reserve + commit, both acknowledged
    refused: int = 0  # OverQuota
    errors: Counter[str] = field(default_factory=Counter)  # QuotaLedgerError subclasses but OverQuota
    unexpected: list[str] = field(default_factory=list)  # anything else: a failure
    latency: dict[str, list[float]] = field(default_factory=lambda: {"reserve": [], "commit": []})
    done_at: list[float] = field(default_factory=list)  # monotonic end of each acknowledged write
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

    def first_success_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` (monotonic) to the first acknowledged write that ended after it."""
        later = [t for t in self.done_at if t > moment]
        return min(later) - moment if later else None

    def summary(self) -> str:
        return (
            f"{self.pairs} pairs in {self.seconds:.1f} s ({self.throughput:.0f}/s), {self.latencies()}, "
            f"{self.refused} refused, errors {dict(self.errors)}, unexpected {len(self.unexpected)}, "
            f"retries {dict(self.retries)}"
        )


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
        local = _ClientRecord()
        held: list[Ack] = []
        sequence = 0
        try:
            while not self._stop.is_set():
                sequence += 1
                queue = rng.choice(hot) if rng.random() < self.shape.hot_share else rng.choice(cold)
                key = f"{self.name}{index}-{sequence}"
                made = self._call(local, "reserve", partial(engine.reserve, queue, {"fpga": 1}, key=key))
                if made is None:
                    continue
                ack = Ack(id=made.id, key=key, queue=queue, state="pending")
                local.acks[made.id] = ack
                if rng.random() < self.shape.rollback_share:
                    if self._call(local, "rollback", partial(engine.rollback, made.id)) is not None:
                        ack.state = "rolled_back"
                    continue
                if self._call(local, "commit", partial(engine.commit, made.id)) is None:
                    continue
                ack.state = "committed"
                local.pairs += 1
                held.append(ack)
                if len(held) > self.shape.hold:
                    oldest = held.pop(0)
                    if self._call(local, "release", partial(engine.release_reservation, oldest.id)):
                        oldest.state = "released"
        except BaseException:  # a client must never die quietly
            local.unexpected.append(f"client {index} died: {traceback.format_exc()}")
        with self._lock:
            local.merge_into(self.result)

    def _call(self, local: _ClientRecord, kind: str, call: Callable[[], T]) -> T | None:
        """``call()`` with its latency and acknowledgement recorded; None when it failed."""
        for _ in range(self.shape.again + 1):
            started = time.monotonic()
            try:
                value = call()
            except OverQuota:
                local.refused += 1
                return None
            except DatabaseUnavailable:
                local.errors["DatabaseUnavailable"] += 1
                if self._stop.is_set():
                    return None
                continue
            except QuotaLedgerError as error:
                local.errors[type(error).__name__] += 1
                return None
            except Exception as error:
                local.unexpected.append(f"{kind}: {type(error).__name__}: {error}")
                return None
            ended = time.monotonic()
            if kind in local.latency:
                local.latency[kind].append(ended - started)
            local.done_at.append(ended)
            return value
        return None


@dataclass(kw_only=True)
class _ClientRecord:
    acks: dict[str, Ack] = field(default_factory=dict)
    pairs: int = 0
    refused: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    latency: dict[str, list[float]] = field(default_factory=lambda: {"reserve": [], "commit": []})
    done_at: list[float] = field(default_factory=list)

    def merge_into(self, result: LoadResult) -> None:
        result.acks.update(self.acks)
        result.pairs += self.pairs
        result.refused += self.refused
        result.errors.update(self.errors)
        result.unexpected += self.unexpected
        for kind, values in self.latency.items():
            result.latency[kind] += values
        result.done_at += self.done_at
