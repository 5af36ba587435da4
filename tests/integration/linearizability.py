"""Does a concurrent history have a sequential explanation? A linearizability checker.

A history is a set of completed calls, each with the interval it ran in (``time.monotonic_ns``
before the call and after its outcome) and the outcome it observed. It is linearizable when the
calls can be put in one total order that keeps real time (a call that ended before another
started comes first) and in which a sequential model, stepped call by call, predicts every
observed outcome.

The search is Wing & Gong's: place, one at a time, a call that no unplaced call precedes in real
time and whose observed outcome is the model's, and backtrack when none fits. Lowe's
memoization bounds it: the set of calls placed and the model's state after them decide
everything that can follow, so each pair is searched once. Calls of one thread never overlap, so
the placed sets are prefixes of each thread's calls: with ``T`` threads of ``k`` calls there are
at most ``(k + 1) ** T`` of them, times the model states different orders can reach.

The model must be deterministic and pure (``step`` returns a new state, never changes the one it
is given), and its states hashable.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

S = TypeVar("S", bound=Hashable)
C = TypeVar("C")
R = TypeVar("R")
C_contra = TypeVar("C_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)


@dataclass(frozen=True)
class Failed:
    """The outcome of a call that raised: the kind of error (its class name)."""

    kind: str


@dataclass(frozen=True, kw_only=True)
class Operation(Generic[C, R]):
    """One completed call: who made it, when it ran, what it asked and what it observed."""

    thread: str
    #: ``time.monotonic_ns()`` just before the call
    start: int
    #: ``time.monotonic_ns()`` just after its outcome (returned or raised)
    end: int
    call: C
    #: what the call returned, or :class:`Failed` when it raised
    result: R


class Model(Protocol[S, C_contra, R_co]):
    """A sequential specification: a start state and a deterministic step."""

    def initial(self) -> S:
        """The state before any call."""
        ...

    def step(self, state: S, call: C_contra) -> tuple[S, R_co]:
        """The state after ``call`` on ``state``, and the outcome the call must observe."""
        ...


@dataclass(frozen=True)
class Counterexample(Generic[C, R]):
    """Why a history is not linearizable: the longest order the search could build, and every
    call that could have come next with the outcome the model expected of it instead."""

    order: tuple[Operation[C, R], ...]
    #: the model's state after ``order``
    state: object
    #: (call, the model's outcome) for each call that could come next
    refused: tuple[tuple[Operation[C, R], R], ...]
    #: how many calls the history has
    total: int

    def __str__(self) -> str:
        lines = [f"no order explains the history: at most {len(self.order)} of {self.total} calls fit"]
        lines += [f"  {i:3d}. {op.thread}: {op.call!r} -> {op.result!r}" for i, op in enumerate(self.order)]
        lines.append(f"  model state then: {self.state!r}")
        for op, expected in self.refused:
            lines.append(
                f"  next could be {op.thread}: {op.call!r}: observed {op.result!r}, model {expected!r}"
            )
        return "\n".join(lines)


def check(history: Sequence[Operation[C, R]], model: Model[S, C, R]) -> Counterexample[C, R] | None:
    """None when ``history`` is linearizable with respect to ``model``, else a counterexample."""
    for op in history:
        if op.end < op.start:
            raise ValueError(f"a call ends before it starts: {op!r}")
    ops = sorted(history, key=lambda op: (op.start, op.end))
    everything = (1 << len(ops)) - 1
    searched: set[tuple[int, S]] = set()
    order: list[Operation[C, R]] = []
    deepest: list[Counterexample[C, R]] = []

    def search(placed: int, state: S) -> bool:
        if placed == everything:
            return True
        if (placed, state) in searched:
            return False
        searched.add((placed, state))
        unplaced = [i for i in range(len(ops)) if not placed >> i & 1]
        # an unplaced call that ended before ``op`` started must come first
        horizon = min(ops[i].end for i in unplaced)
        refused: list[tuple[Operation[C, R], R]] = []
        for i in unplaced:
            op = ops[i]
            if op.start > horizon:
                break  # sorted by start: so do all that follow
            after, expected = model.step(state, op.call)
            if expected != op.result:
                refused.append((op, expected))
                continue
            order.append(op)
            if search(placed | 1 << i, after):
                return True
            order.pop()
        if not deepest or len(order) > len(deepest[0].order):
            deepest[:] = [Counterexample(tuple(order), state, tuple(refused), len(ops))]
        return False

    if search(0, model.initial()):
        return None
    return deepest[0]
