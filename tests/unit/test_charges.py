"""The ledger's rule (quota_ledger.model.charges): admission and charging, pure."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota_ledger.model import charges
from quota_ledger.model.charges import Ask, Charge, decide, decide_one
from quota_ledger.model.counters import Counter
from quota_ledger.model.errors import CounterOverflow, OverQuota
from quota_ledger.model.quantity import APPLICATIONS, MAX_QUANTITY


def counter(
    cid: int,
    scope: str = "root.a",
    resource: str = "vcore",
    *,
    in_use: int = 0,
    reserved: int = 0,
    limit: int | None = None,
    kind: str = "subtree",
    name: str | None = None,
) -> Counter:
    return Counter(cid, kind, scope, resource, in_use, reserved, limit, name)


def test_equality_is_allowed_one_more_breaks_the_limit() -> None:
    c = counter(1, in_use=3, reserved=2, limit=10)
    assert decide_one(Ask("p", [Charge(c, reserved=5)])).admitted
    refused = decide_one(Ask("p", [Charge(c, reserved=6)]))
    assert not refused.admitted
    assert refused.deltas == {}
    (v,) = refused.violations
    assert (v.scope, v.limit, v.in_use, v.reserved, v.requested, v.available) == ("root.a", 10, 3, 2, 6, 5)


def test_every_broken_limit_is_listed_in_charge_order() -> None:
    a = counter(1, "root", limit=1)
    b = counter(2, "root.a", limit=1)
    user = counter(3, "root.a", kind="user", name="alice", limit=1)
    quota = counter(4, "root.a", "requests.cpu", kind="quota", name="ns/q", limit=0)
    decision = decide_one(
        Ask(
            "p",
            [Charge(a, reserved=2), Charge(b, reserved=2), Charge(user, reserved=2), Charge(quota, in_use=1)],
        )
    )
    assert [(v.scope, v.kind, v.name) for v in decision.violations] == [
        ("root", "queue", None),
        ("root.a", "queue", None),
        ("root.a", "user", "alice"),
        ("ns/q", "quota", "ns/q"),
    ]
    with pytest.raises(OverQuota) as raised:
        decision.admit()
    assert len(raised.value.violations) == 4


def test_a_batch_sees_what_the_asks_before_it_added() -> None:
    c = counter(1, limit=10)
    d1, d2, d3 = decide(
        [
            Ask("p", [Charge(c, reserved=6)]),
            Ask("p", [Charge(c, reserved=6)]),
            Ask("p", [Charge(c, reserved=4)]),
        ]
    )
    assert d1.admitted
    assert not d2.admitted
    assert d3.admitted
    assert d2.violations[0].reserved == 6  # it saw the first one's reservation
    assert charges.summed([d1, d2, d3]) == {("usages", 1): (0, 10)}


def test_giving_back_and_unlimited_counters_are_never_refused() -> None:
    over = counter(1, in_use=20, limit=10)
    assert decide_one(Ask("p", [Charge(over, in_use=5, reserved=-5)])).admitted
    assert decide_one(Ask("p", [Charge(counter(2, kind="queue"), reserved=10**9)])).admitted


def test_an_unenforced_ask_lists_what_it_breaks_and_is_admitted() -> None:
    c = counter(1, limit=1)
    decision = decide_one(Ask("p", [Charge(c, in_use=3)], enforced=False))
    assert decision.admitted
    assert decision.refusal() is None
    assert [v.requested for v in decision.violations] == [3]
    assert decision.deltas == {("usages", 1): (3, 0)}


def test_the_bigint_range_refuses_even_an_unenforced_ask() -> None:
    c = counter(1, in_use=MAX_QUANTITY - 1)
    decision = decide_one(Ask("p", [Charge(c, in_use=2)], enforced=False))
    assert not decision.admitted
    with pytest.raises(CounterOverflow):
        decision.admit()


def test_builders_say_what_each_operation_charges() -> None:
    own = counter(1, kind="queue")
    apps = counter(2, "root", APPLICATIONS, limit=5)
    quota = counter(3, "root.a", "pods", kind="quota", name="ns/q", limit=5)
    got = charges.reserving([own, apps, quota], {"vcore": 2, APPLICATIONS: 1}, {"pods": 1})
    assert [(c.in_use, c.reserved) for c in got] == [(0, 2), (1, 0), (1, 0)]
    resolved = charges.resolving([own, apps], {"vcore": 2}, {"vcore": 1}, stopped=True)
    assert [(c.in_use, c.reserved) for c in resolved] == [(1, -2), (-1, 0)]
    assert charges.resolving([own, apps], {"vcore": 2}, {}) == [Charge(own, 0, -2)]
    released = charges.releasing([own, apps], {"vcore": 2}, stopped=False)
    assert [(c.in_use, c.reserved) for c in released] == [(-2, 0)]
    deltas = charges.split({("usages", 1): (1, 2), ("identity", 1): (3, 4)})
    assert deltas == ({1: (1, 2)}, {1: (3, 4)})


# A batch decides exactly what its asks decided one at a time would, each on the counters the
# ones before it left (TigerBeetle's batch: a loop over the single rule).
asks_of = st.lists(
    st.lists(st.tuples(st.integers(0, 3), st.integers(-3, 6), st.integers(-3, 6)), min_size=1, max_size=4),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    limits=st.lists(st.one_of(st.none(), st.integers(0, 12)), min_size=4, max_size=4),
    used=st.lists(st.integers(0, 8), min_size=4, max_size=4),
    raw=asks_of,
    enforced=st.booleans(),
)
def test_a_batch_is_a_loop_over_batches_of_one(
    limits: list[int | None], used: list[int], raw: list[list[tuple[int, int, int]]], enforced: bool
) -> None:
    base = [counter(i, f"root.q{i}", in_use=used[i], limit=limits[i]) for i in range(4)]
    asks = [
        Ask("p", [Charge(base[i], in_use, reserved) for i, in_use, reserved in ask], enforced) for ask in raw
    ]
    batch = decide(asks)
    state = {c.id: c for c in base}
    for ask, decided in zip(asks, batch, strict=True):
        now = Ask("p", [replace(ch, counter=state[ch.counter.id]) for ch in ask.charges], enforced)
        alone = decide_one(now)
        assert alone.admitted == decided.admitted
        assert alone.violations == decided.violations
        assert alone.deltas == decided.deltas
        for (_, cid), (in_use, reserved) in alone.deltas.items():
            c = state[cid]
            state[cid] = replace(c, in_use=c.in_use + in_use, reserved=c.reserved + reserved)
    for c in state.values():
        # an enforced batch never grows a counter past its limit unless it started there
        if enforced and c.limit is not None:
            start = base[c.id]
            assert c.in_use + c.reserved <= max(c.limit, start.in_use + start.reserved)
