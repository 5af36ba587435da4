"""Which limits a reserve breaks, and the 64-bit overflow guard: the rule (model/charges.py) over counters."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quota_ledger.model.charges import Ask, Charge, decide_one
from quota_ledger.model.counters import QUEUE, SUBTREE, Counter
from quota_ledger.model.errors import CounterOverflow
from quota_ledger.model.quantity import MAX_QUANTITY
from quota_ledger.model.values import Violation

_ids = iter(range(1, 10**9))


def limit(scope: str, resource: str, lim: int | None, in_use: int = 0, reserved: int = 0) -> Counter:
    return Counter(next(_ids), SUBTREE, scope, resource, in_use, reserved, lim)


def own(scope: str, resource: str, in_use: int = 0, reserved: int = 0) -> Counter:
    return Counter(next(_ids), QUEUE, scope, resource, in_use, reserved, None)


def violations(partition: str, requested: dict[str, int], counters: list[Counter]) -> list[Violation]:
    """What the rule says a reserve of ``requested`` breaks on ``counters`` (a counter of a
    resource not requested is charged nothing)."""
    charged = [Charge(c, reserved=requested.get(c.resource, 0)) for c in counters]
    return list(decide_one(Ask(partition, charged)).violations)


def check_overflow(deltas: dict[str, int], counters: list[Counter], *, field: str = "reserved") -> None:
    """Raise what the rule refuses for adding ``deltas`` to ``field`` of ``counters``, ignoring limits."""
    charged = [
        Charge(c, **{field: deltas.get(c.resource, 0)})  # type: ignore[arg-type]
        for c in counters
    ]
    decide_one(Ask("default", charged, enforced=False)).admit()


def keys(found: list[Violation]) -> list[tuple[str, str]]:
    return [(v.scope, v.resource) for v in found]


# -- violations -----------------------------------------------------------------------------------


def test_within_limit_has_no_violation() -> None:
    assert violations("default", {"vcore": 100}, [limit("root", "vcore", 1000, 300, 200)]) == []


def test_equality_is_allowed() -> None:
    assert violations("default", {"vcore": 500}, [limit("root", "vcore", 1000, 300, 200)]) == []


def test_one_over_is_a_violation_with_all_numbers() -> None:
    found = violations("p1", {"vcore": 501}, [limit("root.a", "vcore", 1000, 300, 200)])
    assert found == [
        Violation(
            partition="p1",
            scope="root.a",
            resource="vcore",
            limit=1000,
            in_use=300,
            reserved=200,
            requested=501,
        )
    ]
    assert found[0].describe() == (
        "vcore at root.a: limit 1, in use 300m, reserved 200m, requested 501m, available 500m"
    )


def test_reserved_counts_like_in_use() -> None:
    assert keys(violations("default", {"fpga": 1}, [limit("root", "fpga", 4, 0, 4)])) == [("root", "fpga")]
    assert keys(violations("default", {"fpga": 1}, [limit("root", "fpga", 4, 4, 0)])) == [("root", "fpga")]


def test_every_broken_limit_is_reported_not_only_the_first() -> None:
    counters = [
        limit("root", "memory", 10, 9),
        limit("root", "vcore", 10, 0),  # fine
        limit("root.a", "memory", 5, 5),
        limit("root.a", "vcore", 1, 1),
        limit("root.a.b", "memory", 100),  # fine
        limit("root.a.b", "vcore", 0),
    ]
    found = violations("default", {"memory": 2, "vcore": 1}, counters)
    assert keys(found) == [
        ("root", "memory"),
        ("root.a", "memory"),
        ("root.a", "vcore"),
        ("root.a.b", "vcore"),
    ]
    assert [v.requested for v in found] == [2, 2, 1, 1]


def test_violations_keep_counter_order() -> None:
    counters = [limit("root.a", "vcore", 0), limit("root", "vcore", 0)]
    assert keys(violations("default", {"vcore": 1}, counters)) == [("root.a", "vcore"), ("root", "vcore")]


def test_zero_limit_blocks_any_positive_amount() -> None:
    assert keys(violations("default", {"fpga": 1}, [limit("root", "fpga", 0)])) == [("root", "fpga")]


def test_zero_amount_is_never_blocked() -> None:
    counters = [limit("root", "fpga", 0), limit("root.a", "fpga", 2, 5, 5)]
    assert violations("default", {"fpga": 0}, counters) == []


def test_unlimited_counter_is_ignored() -> None:
    counters = [limit("root", "vcore", None, MAX_QUANTITY, MAX_QUANTITY), own("root.a", "vcore", 10**12)]
    assert violations("default", {"vcore": MAX_QUANTITY}, counters) == []


def test_queue_counters_never_carry_limits() -> None:
    assert violations("default", {"vcore": 10**15}, [own("root.a", "vcore", 10**15, 10**15)]) == []


def test_resources_not_requested_are_ignored() -> None:
    counters = [limit("root", "memory", 0, 10, 10)]  # already over, but memory is not requested
    assert violations("default", {"vcore": 1}, counters) == []


def test_limit_lowered_below_usage_blocks_new_requests() -> None:
    found = violations("default", {"vcore": 1}, [limit("root", "vcore", 5, 8, 0)])
    assert keys(found) == [("root", "vcore")]
    assert found[0].in_use == 8
    assert found[0].limit == 5


def test_no_counters_means_no_violations() -> None:
    assert violations("default", {"vcore": 10**18}, []) == []


@given(
    lim=st.integers(0, 100),
    in_use=st.integers(0, 100),
    reserved=st.integers(0, 100),
    amount=st.integers(0, 100),
)
def test_violation_exactly_when_sum_exceeds_limit(lim: int, in_use: int, reserved: int, amount: int) -> None:
    found = violations("default", {"r": amount}, [limit("root", "r", lim, in_use, reserved)])
    assert (found != []) == (amount > 0 and in_use + reserved + amount > lim)


# -- the bigint range -------------------------------------------------------------------------------


def test_overflow_check_allows_exactly_max() -> None:
    check_overflow({"vcore": 1}, [own("root.a", "vcore", reserved=MAX_QUANTITY - 1)])
    check_overflow({"vcore": MAX_QUANTITY}, [own("root.a", "vcore")])


def test_overflow_check_refuses_past_max_naming_counter() -> None:
    counters = [own("root.a", "memory"), limit("root", "vcore", None, reserved=MAX_QUANTITY)]
    with pytest.raises(CounterOverflow) as info:
        check_overflow({"vcore": 1, "memory": 1}, counters)
    assert info.value.scope == "root"
    assert info.value.resource == "vcore"


def test_overflow_check_reads_reserved_by_default_and_in_use_when_asked() -> None:
    counter = own("root.a", "vcore", in_use=MAX_QUANTITY, reserved=0)
    check_overflow({"vcore": 1}, [counter])  # reserved has room
    with pytest.raises(CounterOverflow):
        check_overflow({"vcore": 1}, [counter], field="in_use")
    roomy = own("root.a", "vcore", in_use=0, reserved=MAX_QUANTITY)
    check_overflow({"vcore": 1}, [roomy], field="in_use")


def test_overflow_check_ignores_resources_without_delta() -> None:
    check_overflow({"memory": 5}, [own("root.a", "vcore", MAX_QUANTITY, MAX_QUANTITY)])


def test_counter_is_frozen() -> None:
    counter = own("root.a", "vcore")
    with pytest.raises(dataclasses.FrozenInstanceError):
        counter.in_use = 5  # type: ignore[misc]
