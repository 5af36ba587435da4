"""Requests decided together decide as each would alone, on every decision path.

``decide_all`` hands many prepared requests to the engine from one thread: with batching they
are decided in one batch (as sets on MariaDB and SQLite, by the set functions on PostgreSQL
with its functions, by their steps in one transaction without them); without, one after another.
Either way each must get the outcome it would have had alone, in the batch's order (the
requests of one queue together; "in some order": a keyed request may come after the keyless
ones of its queue), and leave the rows it would have left. Every test checks the outcomes and
figures the limits allow; the first also decides the same requests one at a time in a twin
partition of the same database and compares every row the two leave.
"""

from __future__ import annotations

from typing import Any, Protocol

import pytest
from partition_rows import counters_of, partition_rows
from sql_rows import execute
from sqlalchemy.engine import URL

from quota_ledger import (
    CounterOverflow,
    IdempotencyConflict,
    InvalidRequest,
    OverQuota,
    QuotaEngine,
    ReservationNotFound,
    ReservationState,
    ReservationStateError,
    Usage,
)
from quota_ledger.model.values import Reservation

ZERO_ID = "00000000-0000-0000-0000-000000000000"
TWINS = ("together", "alone")


class DecisionPath(Protocol):
    """The conftest's decision path: whether it batches is all these tests ask of it."""

    @property
    def batching(self) -> bool: ...


def expire_now(url: URL, reservation_id: str) -> None:
    """Move a reservation's expiry back to its creation: past, by the database clock."""
    execute(url, "UPDATE reservations SET expires_at = created_at WHERE id = :id", {"id": reservation_id})


def one_at_a_time(
    engine: QuotaEngine, requests: list[tuple[str, dict[str, Any], dict[str, Any]]]
) -> list[Any]:
    """Each request reserved by a call of its own in partition ``alone``: its reservation or
    its error."""
    outcomes: list[Any] = []
    for queue, resources, options in requests:
        try:
            outcomes.append(engine.reserve(queue, resources, partition="alone", **options))
        except (OverQuota, IdempotencyConflict, CounterOverflow) as error:
            outcomes.append(error)
    return outcomes


def together(engine: QuotaEngine, requests: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> list[Any]:
    """The requests decided together in partition ``together``: each one's outcome, in order."""
    return engine.decide_all(
        [
            engine.prepare_reserve(queue, resources, partition="together", **options)
            for queue, resources, options in requests
        ]
    )


def kinds(outcomes: list[Any]) -> list[type]:
    return [type(o) for o in outcomes]


def test_decide_all_gives_each_operation_the_outcome_it_has_alone(
    path_ledger: QuotaEngine, decision_path: DecisionPath
) -> None:
    engine = path_ledger
    engine.set_limits("root.a", {"fpga": 4})
    earlier = engine.reserve("root.a", {"fpga": 1})
    with pytest.raises(InvalidRequest):  # a malformed id is refused before anything is queued
        engine.prepare_commit("not an id\n")
    before = engine.batch_stats
    outcomes = engine.decide_all(
        [
            engine.prepare_reserve("root.a", {"fpga": 2}, key="k"),
            engine.prepare_reserve("root.a", {"fpga": 2}, key="k"),  # the same request again
            engine.prepare_reserve("root.a", {"fpga": 3}, key="k"),  # the key, another request
            engine.prepare_reserve("root.a", {"fpga": 5}),  # over the limit, whatever went before
            engine.prepare_reserve("root.a", {"fpga": 1}),
            engine.prepare_commit(ZERO_ID),
            engine.prepare_commit(earlier.id),
            engine.prepare_rollback(earlier.id),  # after the commit: refused
            engine.prepare_rollback(ZERO_ID),
        ]
    )
    assert kinds(outcomes) == [
        *(Reservation, Reservation, IdempotencyConflict, OverQuota, Reservation),
        *(ReservationNotFound, Reservation, ReservationStateError, ReservationNotFound),
    ]
    keyed, again, *_ = outcomes
    assert isinstance(keyed, Reservation)
    assert isinstance(again, Reservation)
    assert again.id == keyed.id
    committed = outcomes[6]
    assert isinstance(committed, Reservation)
    assert committed.state is ReservationState.COMMITTED
    usage = engine.usage("root.a")["fpga"]
    assert (usage.in_use, usage.reserved) == (1, 3)
    after = engine.batch_stats
    if decision_path.batching:  # the caller led: one batch decided all nine
        assert (after.batches - before.batches, after.requests - before.requests) == (1, 9)
    else:
        assert after == before
    assert engine.audit() == []


def configure_twins(engine: QuotaEngine) -> None:
    for partition in TWINS:
        engine.set_limits("root", {"fpga": 100, "memory": 1000}, partition=partition)
        engine.set_limits("root.a", {"fpga": 30}, partition=partition)
        engine.set_limits("root.a.x", {"memory": 200}, partition=partition)
        engine.set_limits("root.b", {"fpga": 50, "gpu": 4}, partition=partition)
        for queue in ("root.a", "root.a.x", "root.b"):  # first uses create the queues' counters
            engine.rollback(engine.reserve(queue, {"fpga": 1, "memory": 1, "gpu": 1}, partition=partition).id)


HIGH: dict[str, Any] = {"priority_class": "high"}
# A batch decides "in some order": a keyed request may be decided after the keyless ones of
# its queue (MariaDB, SQLite), so only requests whose order changes nothing have keys.
REQUESTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("root.a", {"fpga": 10}, {**HIGH, "key": "k1", "ttl": 60}),
    ("root.a.x", {"fpga": 5, "memory": 150}, HIGH),
    ("root.b", {"fpga": 20, "gpu": 2}, {**HIGH, "ttl": 120}),
    ("root.a", {"fpga": 10, "memory": 10}, HIGH),
    ("root.a.x", {"memory": 40}, HIGH),
    ("root.b", {"gpu": 2}, HIGH),
    ("root.a", {"fpga": 4}, {"key": "k2"}),
    ("root.b", {"gpu": 1}, HIGH),  # over root.b's gpu
    ("root.a", {"fpga": 1}, HIGH),
    ("root.a.x", {"memory": 20}, HIGH),  # over root.a.x's memory
]


def test_reserves_and_commits_decided_together_leave_the_rows_of_one_at_a_time(
    path_ledger: QuotaEngine, path_url: URL
) -> None:
    configure_twins(path_ledger)
    made = together(path_ledger, REQUESTS)
    alone = one_at_a_time(path_ledger, REQUESTS)
    assert kinds(made) == kinds(alone) == [*[Reservation] * 7, OverQuota, Reservation, OverQuota]
    gpu, memory = made[7], made[9]
    assert isinstance(gpu, OverQuota)
    assert isinstance(memory, OverQuota)
    assert [(v.scope, v.resource, v.limit, v.reserved, v.requested) for v in gpu.violations] == [
        ("root.b", "gpu", 4, 4, 1)
    ]
    assert [(v.scope, v.resource, v.limit, v.reserved, v.requested) for v in memory.violations] == [
        ("root.a.x", "memory", 200, 190, 20)
    ]
    assert partition_rows(path_url, "together") == partition_rows(path_url, "alone")
    usage = {
        (queue, resource): path_ledger.usage(queue, partition="together")[resource]
        for queue, resource in (("root", "fpga"), ("root", "memory"), ("root.a", "fpga"), ("root.b", "gpu"))
    }
    assert usage == {
        ("root", "fpga"): Usage(in_use=0, reserved=50, limit=100),
        ("root", "memory"): Usage(in_use=0, reserved=200, limit=1000),
        ("root.a", "fpga"): Usage(in_use=0, reserved=30, limit=30),
        ("root.b", "gpu"): Usage(in_use=0, reserved=4, limit=4),
    }

    reservations = [o for o in made if isinstance(o, Reservation)]
    twins = [o for o in alone if isinstance(o, Reservation)]
    assert [(r.queue, r.resources, r.key) for r in reservations] == [
        (r.queue, r.resources, r.key) for r in twins
    ]
    committed = path_ledger.decide_all([path_ledger.prepare_commit(r.id) for r in reservations])
    for twin in twins:
        path_ledger.commit(twin.id)
    assert all(isinstance(c, Reservation) and c.state is ReservationState.COMMITTED for c in committed)
    assert [c.committed for c in committed if isinstance(c, Reservation)] == [
        r.resources for r in reservations
    ]
    found = partition_rows(path_url, "together")
    assert found == partition_rows(path_url, "alone")
    counters = counters_of(found)
    assert counters[("subtree", "root", "fpga")] == (50, 0, 100)
    assert counters[("subtree", "root.a.x", "memory")] == (190, 0, 200)
    assert counters[("queue", "root.a", "fpga")] == (25, 0, None)
    assert sorted(row[:4] for row in found["journal"]) == sorted(
        [
            ("root.a", "fpga", 10, "commit"),
            ("root.a.x", "fpga", 5, "commit"),
            ("root.a.x", "memory", 150, "commit"),
            ("root.b", "fpga", 20, "commit"),
            ("root.b", "gpu", 2, "commit"),
            ("root.a", "fpga", 10, "commit"),
            ("root.a", "memory", 10, "commit"),
            ("root.a.x", "memory", 40, "commit"),
            ("root.b", "gpu", 2, "commit"),
            ("root.a", "fpga", 4, "commit"),
            ("root.a", "fpga", 1, "commit"),
        ]
    )
    committed_rows = [
        (key or "", queue, priority or "", ttl)
        for key, state, queue, *_, priority, _, _, _, ttl in found["reservations"]
        if state == "committed"
    ]
    assert sorted(committed_rows) == sorted(
        [
            ("k1", "root.a", "high", 60),
            ("", "root.a.x", "high", 300),
            ("", "root.b", "high", 120),
            ("", "root.a", "high", 300),
            ("", "root.a.x", "high", 300),
            ("", "root.b", "high", 300),
            ("k2", "root.a", "", 300),
            ("", "root.a", "high", 300),
        ]
    )
    assert path_ledger.audit() == []


GI = 1 << 30
HALF = 2**62 - 1


def test_a_batch_admits_what_fits_one_after_another(path_ledger: QuotaEngine, path_url: URL) -> None:
    """One batch of requests in four partitions: each partition's requests are admitted as
    they fit one after another, a refusal does not hold back a smaller request after it, and
    a refused first use of a queue leaves no counter."""
    engine = path_ledger
    for queue, limit in (("root.q", 10), ("root.r", 10)):
        engine.set_limits(queue, {"fpga": limit}, partition="prefix")
        engine.rollback(engine.reserve(queue, {"fpga": 1}, partition="prefix").id)
    engine.set_limits("root", {"fpga": 100}, partition="parents")
    engine.set_limits("root.a", {"fpga": 5, "memory": "4Gi"}, partition="parents")
    engine.set_limits("root.p", {"fpga": 5}, partition="parents")
    engine.set_limits("root.p.x", {"fpga": 4}, partition="parents")
    for queue in ("root.a", "root.p.x", "root.p.y"):
        engine.rollback(engine.reserve(queue, {"fpga": 1, "memory": 1}, partition="parents").id)
    engine.set_limits("root.p", {"fpga": 5}, partition="fresh")
    engine.rollback(engine.reserve("root.p.x", {"fpga": 1}, partition="fresh").id)
    engine.rollback(engine.reserve("root.o", {"fpga": 1}, partition="overflow").id)
    requests: dict[str, list[tuple[str, dict[str, int]]]] = {
        # 5 of 8 fit; then 4 + 4 fit, a third 4 does not, a 2 after it does
        "prefix": [("root.q", {"fpga": 2})] * 8 + [("root.r", {"fpga": n}) for n in (4, 4, 4, 2, 1)],
        "parents": [
            ("root.a", {"fpga": 2, "memory": GI}),
            ("root.a", {"fpga": 1}),
            ("root.a", {"fpga": 1, "memory": 3 * GI + 1}),  # memory over 4Gi by one byte
            ("root.p.x", {"fpga": 2}),
            ("root.p.x", {"fpga": 1}),
            ("root.p.y", {"fpga": 2}),
            ("root.p.y", {"fpga": 1}),  # root.p (5) holds 2 + 1 + 2: over by one
        ],
        "fresh": [
            ("root.p.x", {"fpga": 1}),
            ("root.p.y", {"fpga": 6}),  # a new queue, over root.p: no counter of its own is left
            ("root.p.z", {"fpga": 1, "memory": 2}),  # a new queue: its counters
            ("root.p.z", {"fpga": 1, "vcore": 1}),  # vcore is new to the partition
            ("root.p.z", {"fpga": 1}),
        ],
        "overflow": [("root.o", {"fpga": HALF})] * 3,  # the third would pass the 64-bit range
    }
    operations = [
        engine.prepare_reserve(queue, resources, partition=partition)
        for partition, asked in requests.items()
        for queue, resources in asked
    ]
    outcomes = iter(engine.decide_all(operations))
    got = {partition: [next(outcomes) for _ in asked] for partition, asked in requests.items()}
    ok, over = Reservation, OverQuota
    assert kinds(got["prefix"]) == [ok, ok, ok, ok, ok, over, over, over, ok, ok, over, ok, over]
    assert kinds(got["parents"]) == [ok, ok, over, ok, ok, ok, over]
    assert kinds(got["fresh"]) == [ok, over, ok, ok, ok]
    assert kinds(got["overflow"]) == [ok, ok, CounterOverflow]

    refused = got["prefix"][5]
    assert isinstance(refused, OverQuota)
    assert [(v.scope, v.limit, v.reserved, v.requested) for v in refused.violations] == [
        ("root.q", 10, 10, 2)
    ]
    assert engine.usage("root.q", partition="prefix")["fpga"] == Usage(in_use=0, reserved=10, limit=10)
    assert engine.usage("root.r", partition="prefix")["fpga"] == Usage(in_use=0, reserved=10, limit=10)

    shared = got["parents"][6]
    assert isinstance(shared, OverQuota)
    assert [(v.scope, v.reserved, v.requested) for v in shared.violations] == [("root.p", 5, 1)]
    counters = counters_of(partition_rows(path_url, "parents"))
    assert {k: v[:2] for k, v in counters.items() if v[:2] != (0, 0)} == {
        ("queue", "root.a", "fpga"): (0, 3),
        ("queue", "root.a", "memory"): (0, GI),
        ("subtree", "root.a", "fpga"): (0, 3),
        ("subtree", "root.a", "memory"): (0, GI),
        ("queue", "root.p.x", "fpga"): (0, 3),
        ("queue", "root.p.y", "fpga"): (0, 2),
        ("subtree", "root.p.x", "fpga"): (0, 3),
        ("subtree", "root.p", "fpga"): (0, 5),
        ("subtree", "root", "fpga"): (0, 8),
    }
    first = got["parents"][0]
    assert isinstance(first, Reservation)
    assert engine.get(first.id).resources == {"fpga": 2, "memory": GI}

    counters = counters_of(partition_rows(path_url, "fresh"))
    assert not [key for key in counters if key[1] == "root.p.y"]
    assert {k: v[:2] for k, v in counters.items() if k[1] == "root.p.z"} == {
        ("queue", "root.p.z", "fpga"): (0, 3),
        ("queue", "root.p.z", "memory"): (0, 2),
        ("queue", "root.p.z", "vcore"): (0, 1000),
    }  # no limit on memory or vcore above root.p.z: only its own counters count them
    assert counters[("subtree", "root.p", "fpga")] == (0, 4, 5)

    assert engine.usage("root.o", partition="overflow")["fpga"].reserved == 2 * HALF
    assert engine.audit() == []


def test_keyed_tracked_and_new_queue_requests_in_one_batch(path_ledger: QuotaEngine, path_url: URL) -> None:
    path_ledger.set_limits("root.m", {"fpga": 20})
    path_ledger.rollback(path_ledger.reserve("root.m", {"fpga": 1}).id)
    kept = path_ledger.reserve("root.m", {"fpga": 1}, key="k0")
    outcomes = path_ledger.decide_all(
        [
            path_ledger.prepare_reserve("root.m", {"fpga": 2}),
            path_ledger.prepare_reserve("root.m", {"fpga": 1}, key="k0"),  # an existing key
            path_ledger.prepare_reserve("root.m", {"fpga": 3}, key="k1"),
            path_ledger.prepare_reserve("root.m", {"fpga": 3}, key="k1"),  # the same request again
            path_ledger.prepare_reserve("root.m", {"fpga": 4}, key="k1"),  # the key, another request
            path_ledger.prepare_reserve("root.m", {"fpga": 2}, user="alice", application="app-1"),
            path_ledger.prepare_reserve("root.m", {"fpga": 2}),
            path_ledger.prepare_reserve("root.m.new", {"fpga": 1}),  # no counters yet
            path_ledger.prepare_reserve("root.m.new", {"fpga": 1}),
            path_ledger.prepare_reserve("root.m", {"fpga": 50}),  # over the limit whatever the order
        ]
    )
    assert kinds(outcomes) == [*[Reservation] * 4, IdempotencyConflict, *[Reservation] * 4, OverQuota]
    existing, first, again = outcomes[1:4]
    assert isinstance(existing, Reservation)
    assert isinstance(first, Reservation)
    assert isinstance(again, Reservation)
    assert existing.id == kept.id
    assert first.id == again.id
    tracked = outcomes[5]
    assert isinstance(tracked, Reservation)
    assert (tracked.user, tracked.application) == ("alice", "app-1")
    assert path_ledger.usage("root.m")["fpga"].reserved == 1 + 2 + 3 + 2 + 2 + 1 + 1
    keys = [row[0] for row in partition_rows(path_url, "default")["reservations"] if row[0] is not None]
    assert sorted(keys) == ["k0", "k1"]
    made = [o for o in outcomes if isinstance(o, Reservation) and o is not again and o is not existing]
    committed = path_ledger.decide_all([path_ledger.prepare_commit(r.id) for r in made])
    assert all(isinstance(c, Reservation) and c.state is ReservationState.COMMITTED for c in committed)
    assert path_ledger.usage("root.m")["fpga"] == Usage(in_use=11, reserved=1, limit=20)
    assert path_ledger.audit() == []


def test_commits_in_a_batch_decide_repeats_unknown_expired_resolved_and_partial_ids_as_alone(
    path_ledger: QuotaEngine, path_url: URL
) -> None:
    path_ledger.set_limits("root.c", {"fpga": 20})
    plain = [path_ledger.reserve("root.c", {"fpga": 1}) for _ in range(3)]
    late = path_ledger.reserve("root.c", {"fpga": 2})
    expire_now(path_url, late.id)
    gone = path_ledger.reserve("root.c", {"fpga": 1})
    path_ledger.rollback(gone.id)
    tracked = path_ledger.reserve("root.c", {"fpga": 1}, user="bob")
    partial = path_ledger.reserve("root.c", {"fpga": 3})
    outcomes = path_ledger.decide_all(
        [
            path_ledger.prepare_commit(plain[0].id),
            path_ledger.prepare_commit(plain[1].id),
            path_ledger.prepare_commit(plain[0].id),  # a repeat: returned as committed
            path_ledger.prepare_commit(ZERO_ID),
            path_ledger.prepare_commit(late.id),  # past its expiry: expired on the spot
            path_ledger.prepare_commit(gone.id),
            path_ledger.prepare_commit(tracked.id),
            path_ledger.prepare_commit(partial.id, {"fpga": 1}),  # part of it: the rest goes back
            path_ledger.prepare_commit(plain[2].id),
        ]
    )
    assert kinds(outcomes) == [
        *(Reservation, Reservation, Reservation, ReservationNotFound),
        *(ReservationStateError, ReservationStateError, Reservation, Reservation, Reservation),
    ]
    first, repeat = outcomes[0], outcomes[2]
    assert isinstance(first, Reservation)
    assert isinstance(repeat, Reservation)
    assert first.id == repeat.id
    assert repeat.state is ReservationState.COMMITTED
    expired, rolled = outcomes[4], outcomes[5]
    assert isinstance(expired, ReservationStateError)
    assert isinstance(rolled, ReservationStateError)
    assert (expired.state, rolled.state) == (ReservationState.EXPIRED, ReservationState.ROLLED_BACK)
    assert path_ledger.get(late.id).state is ReservationState.EXPIRED
    some = outcomes[7]
    assert isinstance(some, Reservation)
    assert some.committed == {"fpga": 1}
    assert path_ledger.usage("root.c")["fpga"] == Usage(in_use=5, reserved=0, limit=20)
    assert path_ledger.audit() == []
