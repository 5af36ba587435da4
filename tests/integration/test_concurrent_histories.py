"""Concurrent histories of reserve, commit, rollback, release and usage reads are linearizable.

Each round, a few threads run a few random calls each on a partition of their own, recording
every call's interval and outcome; then :mod:`linearizability` looks for one order of the calls,
consistent with real time, in which a sequential model of the ledger predicts every outcome.

The ledger makes up the reservation ids, so the model cannot predict them: a reserve's outcome is
granted or refused, and a granted one is published under a name of the test's (its thread and
number) once the call has returned. Any thread may then commit, roll back or release it, by the
id bound to that name; real time puts the reserve first. Threads favour the newest published
reservation, so that two of them often resolve the same one at once (a commit racing a release
is where a release can get lost). The usage reads, and one read of each queue after the threads
are done, catch a lost release even when the release's own answer looks right.

A round's seed fixes each thread's choices; which reservation a pick lands on, and the
interleaving, are the threads'. Every ttl is long: nothing expires during a round.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from linearizability import Failed, Operation, check

from quota_ledger import (
    OverQuota,
    QuotaEngine,
    QuotaLedgerError,
    Reservation,
    ReservationState,
    format_quantity,
)

ROUNDS = 15
THREADS = 4
CALLS = 8
#: one round per seed; put a failing round's seed here alone to replay it
SEEDS = tuple(range(ROUNDS))
TTL = 3600.0
RESOURCE = "vcore"
#: vcore in milli-cores: root.a's limit binds first, root's when root.b holds some
LIMITS = {"root": 6000, "root.a": 4000}
QUEUES = ("root.a", "root.a", "root.b")
READS = ("root.a", "root.b", "root")
AMOUNTS = (1000, 2000)
#: how often a thread resolves the newest published reservation rather than any one
NEWEST = 0.8
_JOIN_TIMEOUT = 60.0

PENDING = ReservationState.PENDING.value
COMMITTED = ReservationState.COMMITTED.value
ROLLED_BACK = ReservationState.ROLLED_BACK.value


# -- calls and outcomes ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Reserve:
    name: str
    queue: str
    amount: int


@dataclass(frozen=True)
class Commit:
    name: str
    #: None commits all that was reserved
    amount: int | None


@dataclass(frozen=True)
class Rollback:
    name: str


@dataclass(frozen=True)
class ReleaseReservation:
    name: str


@dataclass(frozen=True)
class ReadUsage:
    queue: str


Call = Reserve | Commit | Rollback | ReleaseReservation | ReadUsage


@dataclass(frozen=True)
class Seen:
    """What a call returned of a reservation."""

    state: str
    committed: int | None = None
    released: bool = False


GRANTED = "granted"
#: a reserve: GRANTED or Failed; a resolution: Seen or Failed; a usage read: (in_use, reserved)
Result = str | Seen | tuple[int, int] | Failed
Op = Operation[Call, Result]


# -- the sequential model ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Held:
    """A granted reservation, as the model knows it."""

    name: str
    queue: str
    amount: int
    state: str = PENDING
    committed: int = 0
    released: bool = False

    def seen(self) -> Seen:
        committed = self.committed if self.state == COMMITTED else None
        return Seen(self.state, committed, self.released)


#: every granted reservation, sorted by name
State = tuple[Held, ...]


def _in_subtree(queue: str, scope: str) -> bool:
    return queue == scope or queue.startswith(scope + ".")


def _usage(state: State, scope: str) -> tuple[int, int]:
    mine = [h for h in state if _in_subtree(h.queue, scope)]
    in_use = sum(h.committed for h in mine if h.state == COMMITTED and not h.released)
    reserved = sum(h.amount for h in mine if h.state == PENDING)
    return in_use, reserved


def _put(state: State, held: Held) -> State:
    return tuple(sorted([*(h for h in state if h.name != held.name), held], key=lambda h: h.name))


class LedgerSpec:
    """The ledger's reservation calls on one resource, one call at a time."""

    def initial(self) -> State:
        return ()

    def step(self, state: State, call: Call) -> tuple[State, Result]:
        if isinstance(call, ReadUsage):
            return state, _usage(state, call.queue)
        if isinstance(call, Reserve):
            for scope, limit in LIMITS.items():
                in_use, reserved = _usage(state, scope)
                if _in_subtree(call.queue, scope) and in_use + reserved + call.amount > limit:
                    return state, Failed(OverQuota.__name__)
            return _put(state, Held(call.name, call.queue, call.amount)), GRANTED
        held = next(h for h in state if h.name == call.name)
        if isinstance(call, Commit):
            if held.state == PENDING:
                amount = held.amount if call.amount is None else call.amount
                held = replace(held, state=COMMITTED, committed=amount)
                return _put(state, held), held.seen()
            if held.state == COMMITTED:
                return state, held.seen()
            return state, Failed("ReservationStateError")
        if isinstance(call, Rollback):
            if held.state == COMMITTED:
                return state, Failed("ReservationStateError")
            held = replace(held, state=ROLLED_BACK)
            return _put(state, held), held.seen()
        # release_reservation: a pending one is rolled back, a committed one released once
        if held.state == PENDING:
            held = replace(held, state=ROLLED_BACK)
        elif held.state == COMMITTED:
            held = replace(held, released=True)
        return _put(state, held), held.seen()


# -- running a round ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Granted:
    name: str
    id: str
    amount: int


class Board:
    """The reservations granted so far in a round, each published after its reserve returned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._granted: list[Granted] = []

    def publish(self, granted: Granted) -> None:
        with self._lock:
            self._granted.append(granted)

    def pick(self, rng: random.Random) -> Granted | None:
        with self._lock:
            if not self._granted:
                return None
            if rng.random() < NEWEST:
                return self._granted[-1]
            return rng.choice(self._granted)


def _choose(rng: random.Random, thread: str, number: int, board: Board) -> tuple[Call, Granted | None]:
    """A thread's next call: 30 % reserve (all, until something is granted), 25 % commit (a third
    of them partial), 10 % rollback, 20 % release, 15 % usage read."""
    roll = rng.random()
    if roll >= 0.85:
        return ReadUsage(rng.choice(READS)), None
    target = board.pick(rng)
    if target is None or roll < 0.3:
        return Reserve(f"{thread}.{number}", rng.choice(QUEUES), rng.choice(AMOUNTS)), None
    if roll < 0.55:
        partial = rng.random() < 0.3
        amount = rng.randrange(0, target.amount, 500) if partial else None
        return Commit(target.name, amount), target
    if roll < 0.65:
        return Rollback(target.name), target
    return ReleaseReservation(target.name), target


def _seen(reservation: Reservation) -> Seen:
    committed = None if reservation.committed is None else reservation.committed.get(RESOURCE, 0)
    return Seen(reservation.state.value, committed, reservation.released_at is not None)


def _call(engine: QuotaEngine, partition: str, call: Call, target: Granted | None) -> Result | Reservation:
    """Make ``call``; a granted reserve returns its reservation."""
    if isinstance(call, Reserve):
        request = {RESOURCE: format_quantity(RESOURCE, call.amount)}
        return engine.reserve(call.queue, request, partition=partition, ttl=TTL)
    if isinstance(call, ReadUsage):
        found = engine.usage(call.queue, partition=partition).get(RESOURCE)
        return (0, 0) if found is None else (found.in_use, found.reserved)
    assert target is not None
    if isinstance(call, Commit):
        amounts = None if call.amount is None else {RESOURCE: format_quantity(RESOURCE, call.amount)}
        return _seen(engine.commit(target.id, amounts))
    if isinstance(call, Rollback):
        return _seen(engine.rollback(target.id))
    return _seen(engine.release_reservation(target.id))


def _timed(
    engine: QuotaEngine, partition: str, thread: str, call: Call, target: Granted | None, board: Board
) -> Op:
    start = time.monotonic_ns()
    try:
        outcome = _call(engine, partition, call, target)
    except QuotaLedgerError as error:
        outcome = Failed(type(error).__name__)
    end = time.monotonic_ns()
    if isinstance(outcome, Reservation):
        assert isinstance(call, Reserve)
        board.publish(Granted(call.name, outcome.id, call.amount))
        outcome = GRANTED
    return Operation(thread=thread, start=start, end=end, call=call, result=outcome)


def _run_round(engine: QuotaEngine, partition: str, seed: int) -> tuple[list[Op], list[str]]:
    """The history of one round, and the tracebacks of calls that raised something unexpected."""
    for scope, limit in LIMITS.items():
        engine.set_limits(scope, {RESOURCE: format_quantity(RESOURCE, limit)}, partition=partition)
    board = Board()
    history: list[Op] = []
    crashes: list[str] = []
    start_together = threading.Barrier(THREADS)

    def work(thread: str) -> None:
        rng = random.Random(f"{seed}:{thread}")
        try:
            start_together.wait()
            for number in range(CALLS):
                call, target = _choose(rng, thread, number, board)
                history.append(_timed(engine, partition, thread, call, target, board))
        except Exception:  # reported with the round's seed
            crashes.append(f"{thread}:\n{traceback.format_exc()}")
            start_together.abort()

    threads = [threading.Thread(target=work, args=(f"t{i}",), daemon=True) for i in range(THREADS)]
    for each in threads:
        each.start()
    for each in threads:
        each.join(_JOIN_TIMEOUT)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"seed {seed}: threads still running after {_JOIN_TIMEOUT} s (lock wait?)"
    # what the threads left behind, read after all of them: a lost release stays visible here
    for queue in READS:
        history.append(_timed(engine, partition, "end", ReadUsage(queue), None, board))
    return history, crashes


def _describe(history: Sequence[Op]) -> str:
    first = min(op.start for op in history)
    lines = []
    for op in sorted(history, key=lambda op: op.start):
        span = f"{(op.start - first) / 1e6:8.2f} .. {(op.end - first) / 1e6:8.2f} ms"
        lines.append(f"  {span}  {op.thread:>3}: {op.call!r} -> {op.result!r}")
    return "\n".join(lines)


class _Path(Protocol):
    @property
    def name(self) -> str: ...


def _resolves(op: Op) -> str | None:
    """The name of the reservation ``op`` commits, rolls back or releases, if it does."""
    call = op.call
    return call.name if isinstance(call, Commit | Rollback | ReleaseReservation) else None


def _raced(history: Sequence[Op]) -> int:
    """How many pairs of calls of two threads resolved one reservation at overlapping times."""
    resolving = [op for op in history if _resolves(op) is not None]
    return sum(
        1
        for i, one in enumerate(resolving)
        for other in resolving[i + 1 :]
        if one.thread != other.thread
        and _resolves(one) == _resolves(other)
        and one.start < other.end
        and other.start < one.end
    )


def test_concurrent_histories_are_linearizable(decision_path: _Path, path_ledger: QuotaEngine) -> None:
    spec = LedgerSpec()
    refused = raced = 0
    for seed in SEEDS:
        history, crashes = _run_round(path_ledger, f"round{seed}", seed)
        where = f"{decision_path.name}, seed {seed} (replay: SEEDS = ({seed},))"
        assert not crashes, f"{where}: calls raised\n" + "\n".join(crashes)
        found = check(history, spec)
        assert found is None, f"{where}: not linearizable\n{found}\nhistory:\n{_describe(history)}"
        refused += sum(op.result == Failed(OverQuota.__name__) for op in history)
        raced += _raced(history)
    # the rounds did what they are for: limits refused, and threads resolved one reservation at once
    assert refused > 0
    assert raced > 0
