"""The linearizability checker on hand-made histories of a register and of a bounded counter."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))  # linearizability

from linearizability import Counterexample, Failed, Operation, check


# -- a register: write a value, read the last one ------------------------------------------------
@dataclass(frozen=True)
class Write:
    value: int


@dataclass(frozen=True)
class Read:
    pass


RegisterCall = Write | Read
RegisterResult = int | str


class Register:
    def initial(self) -> int:
        return 0

    def step(self, state: int, call: RegisterCall) -> tuple[int, RegisterResult]:
        if isinstance(call, Write):
            return call.value, "ok"
        return state, state


RegisterOp = Operation[RegisterCall, RegisterResult]


def op(thread: str, start: int, end: int, call: RegisterCall, result: RegisterResult) -> RegisterOp:
    return Operation(thread=thread, start=start, end=end, call=call, result=result)


def test_a_sequential_history_the_model_explains_is_accepted() -> None:
    history = [
        op("a", 0, 1, Write(1), "ok"),
        op("a", 2, 3, Read(), 1),
        op("b", 4, 5, Write(2), "ok"),
        op("a", 6, 7, Read(), 2),
    ]
    assert check(history, Register()) is None


def test_a_read_that_overlaps_a_write_may_see_it_although_it_started_first() -> None:
    history = [op("reader", 0, 10, Read(), 1), op("writer", 2, 8, Write(1), "ok")]
    assert check(history, Register()) is None


def test_a_read_that_overlaps_a_write_may_miss_it() -> None:
    history = [op("writer", 0, 10, Write(1), "ok"), op("reader", 2, 8, Read(), 0)]
    assert check(history, Register()) is None


def test_a_read_after_a_finished_write_that_misses_it_is_rejected() -> None:
    history = [op("writer", 0, 5, Write(1), "ok"), op("reader", 6, 9, Read(), 0)]
    found = check(history, Register())
    assert found is not None
    assert [o.call for o in found.order] == [Write(1)]
    assert found.refused == ((history[1], 1),)


def test_a_read_of_a_value_nobody_wrote_is_rejected() -> None:
    history = [
        op("a", 0, 10, Write(1), "ok"),
        op("b", 0, 10, Write(2), "ok"),
        op("c", 0, 10, Read(), 3),
    ]
    found = check(history, Register())
    assert found is not None
    assert len(found.order) == 2
    assert [o.call for o, _ in found.refused] == [Read()]


def test_a_read_of_an_overwritten_value_after_both_writes_finished_is_rejected() -> None:
    history = [
        op("a", 0, 1, Write(1), "ok"),
        op("b", 2, 3, Write(2), "ok"),
        op("c", 4, 5, Read(), 1),
    ]
    assert check(history, Register()) is not None
    # the same read overlapping the second write may be ordered before it
    overlapping = [*history[:2], op("c", 2, 5, Read(), 1)]
    assert check(overlapping, Register()) is None


def test_two_reads_in_a_row_cannot_see_two_concurrent_writes_in_both_orders() -> None:
    writes = [op("a", 0, 20, Write(1), "ok"), op("b", 0, 20, Write(2), "ok")]
    one_order = [*writes, op("c", 1, 2, Read(), 1), op("c", 3, 4, Read(), 2)]
    assert check(one_order, Register()) is None
    both_orders = [*one_order, op("d", 5, 6, Read(), 1)]
    found = check(both_orders, Register())
    assert found is not None
    assert "model 2" in str(found)


def test_a_call_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(ValueError, match="ends before it starts"):
        check([op("a", 5, 4, Read(), 0)], Register())


# -- a bounded counter: taking is refused at the capacity -----------------------------------------
@dataclass(frozen=True)
class Take:
    pass


@dataclass(frozen=True)
class Count:
    pass


CounterCall = Take | Count
CounterResult = str | int | Failed


@dataclass(frozen=True)
class Bounded:
    capacity: int

    def initial(self) -> int:
        return 0

    def step(self, state: int, call: CounterCall) -> tuple[int, CounterResult]:
        if isinstance(call, Count):
            return state, state
        if state >= self.capacity:
            return state, Failed("Full")
        return state + 1, "taken"


class Counting:
    """A model, counting the steps the search asks of it."""

    def __init__(self, inner: Bounded) -> None:
        self.inner = inner
        self.steps = 0

    def initial(self) -> int:
        return self.inner.initial()

    def step(self, state: int, call: CounterCall) -> tuple[int, CounterResult]:
        self.steps += 1
        return self.inner.step(state, call)


def take(thread: str, start: int, end: int, result: CounterResult) -> Operation[CounterCall, CounterResult]:
    return Operation(thread=thread, start=start, end=end, call=Take(), result=result)


def test_of_two_concurrent_takes_of_the_last_unit_one_is_refused() -> None:
    history = [take("a", 0, 10, Failed("Full")), take("b", 1, 9, "taken")]
    assert check(history, Bounded(1)) is None


def test_two_takes_of_one_unit_cannot_both_succeed() -> None:
    history = [take("a", 0, 10, "taken"), take("b", 1, 9, "taken")]
    found = check(history, Bounded(1))
    assert found is not None
    assert found.refused[0][1] == Failed("Full")


def test_a_refusal_with_room_left_is_rejected() -> None:
    history = [take("a", 0, 10, Failed("Full")), take("b", 1, 9, Failed("Full"))]
    assert check(history, Bounded(1)) is not None


def _interleaved(threads: int, calls: int, final: int) -> list[Operation[CounterCall, CounterResult]]:
    """Each thread's calls one after the other, overlapping every other thread's, then a count."""
    history = [
        take(f"t{t}", 10 * k + t, 10 * k + t + 9, "taken") for t in range(threads) for k in range(calls)
    ]
    end = 10 * calls + threads + 10
    history.append(Operation(thread="main", start=end, end=end + 1, call=Count(), result=final))
    return history


def test_the_search_is_memoized_by_placed_calls_and_state() -> None:
    # 3 threads of 4 overlapping calls: 34,650 orders, but 5**3 sets of placed calls (one state each)
    model = Counting(Bounded(100))
    assert check(_interleaved(3, 4, final=12), model) is None
    model = Counting(Bounded(100))
    found = check(_interleaved(3, 4, final=11), model)
    assert isinstance(found, Counterexample)
    assert len(found.order) == 12
    assert model.steps <= 5**3 * 3 + 1
