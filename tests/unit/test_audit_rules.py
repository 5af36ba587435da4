"""What every counter must hold according to the history, and how drift is reported."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from quota_ledger.model.counters import QUEUE, SUBTREE, Counter
from quota_ledger.model.drift import (
    COMMIT,
    RELEASE,
    Settled,
    expected_values,
    find_drift,
    journal_drift,
    missing_queue_counters,
)
from quota_ledger.model.queues import in_subtree
from quota_ledger.model.values import Drift

_ids = iter(range(1, 10**9))


def own(scope: str, resource: str, in_use: int = 0, reserved: int = 0) -> Counter:
    return Counter(next(_ids), QUEUE, scope, resource, in_use, reserved, None)


def subtree(scope: str, resource: str, in_use: int = 0, reserved: int = 0, lim: int = 100) -> Counter:
    return Counter(next(_ids), SUBTREE, scope, resource, in_use, reserved, lim)


IN_USE = {
    ("root", "vcore"): 1,
    ("root.a", "vcore"): 10,
    ("root.a.x", "vcore"): 100,
    ("root.ab", "vcore"): 1000,
    ("root.b", "vcore"): 10000,
    ("root.a", "memory"): 7,
}
RESERVED = {
    ("root.a", "vcore"): 2,
    ("root.a.x", "vcore"): 20,
    ("root.ab", "vcore"): 200,
    ("root.a.x", "memory"): 3,
}


_QUEUES = ["root", "root.a", "root.a.x", "root.ab", "root.b"]


# -- expected_values ------------------------------------------------------------------------------


def test_queue_counter_expects_its_own_sums() -> None:
    assert expected_values(own("root.a", "vcore"), IN_USE, RESERVED) == (10, 2)
    assert expected_values(own("root.a.x", "memory"), IN_USE, RESERVED) == (0, 3)


def test_queue_counter_without_history_expects_zero() -> None:
    assert expected_values(own("root.c", "vcore"), IN_USE, RESERVED) == (0, 0)
    assert expected_values(own("root.a", "fpga"), IN_USE, RESERVED) == (0, 0)


def test_subtree_counter_sums_queue_and_descendants() -> None:
    assert expected_values(subtree("root.a", "vcore"), IN_USE, RESERVED) == (110, 22)


def test_subtree_sum_does_not_confuse_name_prefixes() -> None:
    # root.ab is a sibling of root.a, not a child
    assert expected_values(subtree("root.a", "vcore"), IN_USE, RESERVED) == (10 + 100, 2 + 20)
    assert expected_values(subtree("root.ab", "vcore"), IN_USE, RESERVED) == (1000, 200)


def test_root_subtree_sums_everything_of_its_resource() -> None:
    assert expected_values(subtree("root", "vcore"), IN_USE, RESERVED) == (11111, 222)
    assert expected_values(subtree("root", "memory"), IN_USE, RESERVED) == (7, 3)


def test_leaf_subtree_counter_equals_its_queue() -> None:
    assert expected_values(subtree("root.b", "vcore"), IN_USE, RESERVED) == (10000, 0)


@given(
    sums=st.dictionaries(
        st.tuples(st.sampled_from(_QUEUES), st.sampled_from("xy")),
        st.integers(0, 1000),
    ),
    scope=st.sampled_from([*_QUEUES, "root.c"]),
)
def test_subtree_expectation_is_sum_over_in_subtree(sums: dict[tuple[str, str], int], scope: str) -> None:
    want = sum(v for (q, r), v in sums.items() if r == "x" and in_subtree(q, scope))
    assert expected_values(subtree(scope, "x"), sums, {}) == (want, 0)
    assert expected_values(subtree(scope, "x"), {}, sums) == (0, want)


# -- find_drift -----------------------------------------------------------------------------------


def _consistent() -> list[Counter]:
    return [
        own("root.a", "vcore", 10, 2),
        own("root.a.x", "vcore", 100, 20),
        subtree("root", "vcore", 11111, 222),
        subtree("root.a", "vcore", 110, 22),
    ]


def test_no_drift_when_counters_match_history() -> None:
    assert find_drift("default", _consistent(), IN_USE, RESERVED) == []


def test_in_use_drift_is_reported_with_expected_values() -> None:
    counters = [own("root.a", "vcore", 11, 2)]
    assert find_drift("p1", counters, IN_USE, RESERVED) == [
        Drift(
            partition="p1",
            scope_type=QUEUE,
            scope="root.a",
            resource="vcore",
            in_use=11,
            reserved=2,
            expected_in_use=10,
            expected_reserved=2,
        )
    ]


def test_reserved_drift_is_reported() -> None:
    drift = find_drift("default", [subtree("root.a", "vcore", 110, 0)], IN_USE, RESERVED)
    assert [(d.scope_type, d.scope, d.expected_reserved, d.reserved) for d in drift] == [
        (SUBTREE, "root.a", 22, 0)
    ]
    assert drift[0].fixed is False


def test_every_drifting_counter_is_reported_in_counter_order() -> None:
    counters = [
        own("root.a", "vcore", 10, 2),  # fine
        own("root.b", "vcore", 0, 0),  # history says 10000 in use
        subtree("root", "vcore", 0, 0),  # wrong
        subtree("root.a", "vcore", 110, 22),  # fine
        own("root.c", "fpga", 1, 0),  # history says nothing
    ]
    drift = find_drift("default", counters, IN_USE, RESERVED)
    assert [(d.scope_type, d.scope, d.resource) for d in drift] == [
        (QUEUE, "root.b", "vcore"),
        (SUBTREE, "root", "vcore"),
        (QUEUE, "root.c", "fpga"),
    ]
    assert [(d.expected_in_use, d.expected_reserved) for d in drift] == [(10000, 0), (11111, 222), (0, 0)]


def test_empty_history_and_zero_counters_do_not_drift() -> None:
    assert find_drift("default", [own("root.a", "vcore"), subtree("root", "vcore")], {}, {}) == []


# -- missing_queue_counters -----------------------------------------------------------------------


def test_history_without_queue_counter_is_missing() -> None:
    counters = [own("root.a", "vcore"), subtree("root.b", "vcore")]
    assert missing_queue_counters(counters, IN_USE, RESERVED) == [
        ("root", "vcore"),
        ("root.a", "memory"),
        ("root.a.x", "memory"),
        ("root.a.x", "vcore"),
        ("root.ab", "vcore"),
        ("root.b", "vcore"),  # a subtree counter is not a queue counter
    ]


def test_zero_sums_need_no_counter() -> None:
    assert missing_queue_counters([], {("root.a", "vcore"): 0}, {("root.b", "vcore"): 0}) == []


def test_nothing_missing_when_all_counters_exist() -> None:
    pairs = set(IN_USE) | set(RESERVED)
    counters = [own(q, r) for q, r in sorted(pairs)]
    assert missing_queue_counters(counters, IN_USE, RESERVED) == []


def _settled(rid: str, committed: dict[str, int], *, released: bool = False) -> Settled:
    return Settled(reservation_id=rid, queue="root.q", committed=committed, released=released)


def test_a_journal_that_agrees_with_its_reservations_does_not_drift() -> None:
    settled = [_settled("a", {"vcore": 2}), _settled("b", {"vcore": 1, "fpga": 1}, released=True)]
    entries = {("a", COMMIT, "vcore"): 2, ("b", COMMIT, "vcore"): 1, ("b", COMMIT, "fpga"): 1}
    entries |= {("b", RELEASE, "vcore"): 1, ("b", RELEASE, "fpga"): 1}
    assert journal_drift("default", settled, entries, {"a": "root.q", "b": "root.q"}) == []


def test_a_release_of_less_than_was_committed_drifts() -> None:
    settled = [_settled("b", {"vcore": 3}, released=True)]
    found = journal_drift("default", settled, {("b", COMMIT, "vcore"): 3}, {"b": "root.q"})
    assert [(d.scope_type, d.name, d.in_use, d.expected_in_use) for d in found] == [(RELEASE, "b", 0, 3)]


def test_a_commit_entry_of_a_reservation_that_is_not_committed_drifts() -> None:
    found = journal_drift("default", [], {("c", COMMIT, "vcore"): 5}, {"c": "root.x"})
    assert [(d.scope_type, d.scope, d.in_use, d.expected_in_use) for d in found] == [(COMMIT, "root.x", 5, 0)]


def test_a_committed_reservation_without_its_commit_entry_drifts() -> None:
    found = journal_drift("default", [_settled("a", {"vcore": 2})], {}, {})
    assert [(d.scope_type, d.in_use, d.expected_in_use) for d in found] == [(COMMIT, 0, 2)]
