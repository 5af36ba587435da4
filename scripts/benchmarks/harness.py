"""What every case runs on: progress lines, the one error that stops a run, worker threads
counted over a timed window, and side-by-side rounds reported as medians."""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol


def log(message: str) -> None:
    """A progress line on stderr (stdout holds only the report)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """The benchmark cannot go on (bad URL, a worker failed, pgbench failed...)."""


class PairWorker(Protocol):
    """One thread's work: ``pair()`` is one reserve+commit, run in a loop."""

    def pair(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class Sample:
    """One measured window."""

    pairs_per_s: float
    pairs: int
    seconds: float


def run_threads(
    workers: Sequence[PairWorker],
    warmup: float,
    seconds: float,
    during: Callable[[], None] | None = None,
) -> Sample:
    """Run ``pair()`` in a loop on one thread per worker; count pairs after the warm-up.

    The measured window is ``seconds`` long, or as long as ``during()`` runs if given.
    """
    stop = threading.Event()
    counts = [0] * len(workers)
    failures: list[BaseException] = []

    def loop(index: int) -> None:
        worker = workers[index]
        try:
            while not stop.is_set():
                worker.pair()
                counts[index] += 1
        except BaseException as error:  # reported by the main thread
            failures.append(error)
            stop.set()

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    try:
        stop.wait(warmup)
        before, started = sum(counts), time.perf_counter()
        if during is None:
            stop.wait(seconds)
        else:
            during()
        after, ended = sum(counts), time.perf_counter()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    if failures:
        raise BenchError(f"a worker failed: {failures[0]!r}") from failures[0]
    elapsed = ended - started
    return Sample(pairs_per_s=(after - before) / elapsed, pairs=after - before, seconds=elapsed)


def side_by_side(
    repeat: int,
    before_each: Callable[[], None],
    first: Callable[[int], float],
    second: Callable[[int], float],
) -> Iterator[tuple[float, float]]:
    """``repeat`` rounds of ``first`` then ``second`` (each given the round's index and
    returning pairs/s), ``before_each`` ahead of every round: two cases that alternate see the
    same machine, where two runs one after the other would not. Yields each round's pair."""
    for round_ in range(repeat):
        before_each()
        a = first(round_)
        b = second(round_)
        yield a, b


def median(values: Iterable[float]) -> float:
    """The median: what a case reports of its repeats."""
    return statistics.median(values)


def median_ratio(numerator: Iterable[float], denominator: Iterable[float]) -> float:
    """median(numerator) / median(denominator): the ratio a side-by-side case reports."""
    return statistics.median(numerator) / statistics.median(denominator)
