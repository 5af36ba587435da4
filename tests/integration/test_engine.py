"""The ledger's semantics, on every backend (SQLite, PostgreSQL, MariaDB).

The tests of what a reserve, commit, rollback, release or expiry decides (admission, refusals
with every limit broken, the hierarchy's limits, keys, whole and partial commits, state changes,
a late commit, the sweep) run on every decision path (``path_ledger``: each backend, batching
off and on, PostgreSQL's functions on and off), with ``decide_all`` where requests may be
decided together; reads, configuration, argument checks made before anything is decided, the
audit and the constraints run on each backend (``ledger``)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, func, select, text, update
from sqlalchemy.engine import URL

from quota_ledger import (
    IdempotencyConflict,
    InvalidCommit,
    InvalidQuantity,
    InvalidRequest,
    OverQuota,
    QuotaEngine,
    ReservationNotFound,
    ReservationState,
    ReservationStateError,
    Usage,
    UsageUnderflow,
)
from quota_ledger.driver.dialect import normalize_url
from quota_ledger.driver.schema import quota_journal, quota_usages, reservations
from quota_ledger.model.values import Reservation

GI = 2**30


def count_rows(url: URL, table: object) -> int:
    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(table)).scalar_one()  # type: ignore[arg-type]
    engine.dispose()
    return int(n)


def test_reserve_then_commit_moves_reserved_to_in_use(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    ledger.set_limits("root.project-a", {"fpga": 5, "memory": "64Gi", "vcore": "16"})
    r = ledger.reserve("root.project-a", {"fpga": 2, "memory": "4Gi"}, ttl=300, key="req-7f3a")
    assert r.state is ReservationState.PENDING
    assert r.resources == {"fpga": 2, "memory": 4 * GI}
    assert ledger.usage("root.project-a")["fpga"] == Usage(in_use=0, reserved=2, limit=5)
    committed = ledger.commit(r.id)
    assert committed.state is ReservationState.COMMITTED
    assert committed.committed == {"fpga": 2, "memory": 4 * GI}
    usage = ledger.usage("root.project-a")
    assert usage["fpga"] == Usage(in_use=2, reserved=0, limit=5)
    assert usage["memory"] == Usage(in_use=4 * GI, reserved=0, limit=64 * GI)
    assert usage["vcore"] == Usage(in_use=0, reserved=0, limit=16000)
    assert usage["fpga"].available == 3


def test_expiry_time_is_database_clock_plus_ttl(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    r = ledger.reserve("root.a", {"fpga": 1}, ttl=120)
    assert r.expires_at - r.created_at == timedelta(seconds=120)
    assert r.expires_at.tzinfo is not None
    assert ledger.get(r.id).expires_at == r.expires_at


def test_reservation_counts_against_every_limited_ancestor(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    ledger.set_limits("root", {"fpga": 10})
    ledger.set_limits("root.a", {"fpga": 4})
    # Children's maxima may add up to more than the parent's; the parent caps their sum.
    ledger.set_limits("root.a.b", {"fpga": 4})
    ledger.set_limits("root.a.c", {"fpga": 3})
    made = ledger.decide_all(
        [ledger.prepare_reserve("root.a.b", {"fpga": 3}), ledger.prepare_reserve("root.a.c", {"fpga": 1})]
    )
    assert all(isinstance(r, Reservation) for r in made)
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.a.b", {"fpga": 1})
    assert [(v.scope, v.resource) for v in refused.value.violations] == [("root.a", "fpga")]
    assert ledger.usage("root")["fpga"] == Usage(in_use=0, reserved=4, limit=10)
    assert ledger.usage("root.a.b")["fpga"] == Usage(in_use=0, reserved=3, limit=4)
    # A sibling subtree is only bounded by root.
    ledger.reserve("root.z", {"fpga": 6})
    with pytest.raises(OverQuota):
        ledger.reserve("root.z", {"fpga": 1})


def test_over_quota_lists_every_broken_limit_and_records_nothing(
    path_ledger: QuotaEngine, path_url: URL
) -> None:
    ledger, db_url = path_ledger, path_url
    ledger.set_limits("root", {"memory": "8Gi"})
    ledger.set_limits("root.a", {"fpga": 2, "memory": "4Gi"})
    ledger.reserve("root.a", {"fpga": 1, "memory": "3Gi"})
    before = ledger.usage("root")
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.a", {"fpga": 2, "memory": "6Gi", "vcore": 1}, key="k1")
    broken = {(v.scope, v.resource): v for v in refused.value.violations}
    assert set(broken) == {("root", "memory"), ("root.a", "fpga"), ("root.a", "memory")}
    v = broken[("root.a", "memory")]
    assert (v.limit, v.in_use, v.reserved, v.requested) == (4 * GI, 0, 3 * GI, 6 * GI)
    assert ledger.usage("root") == before
    assert count_rows(db_url, reservations) == 1
    # The refused key was not consumed: the same key can be used once it fits.
    assert ledger.reserve("root.a", {"fpga": 1}, key="k1").state is ReservationState.PENDING


def test_request_landing_exactly_on_the_limit_is_allowed(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    ledger.set_limits("root.a", {"fpga": 3})
    made = ledger.decide_all([ledger.prepare_reserve("root.a", {"fpga": n}) for n in (1, 2, 1)])
    assert [type(r) for r in made] == [Reservation, Reservation, OverQuota]
    assert ledger.usage("root.a")["fpga"].available == 0


def test_zero_limit_blocks_and_missing_limit_is_unlimited(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    ledger.set_limits("root.a", {"fpga": 0})
    with pytest.raises(OverQuota):
        ledger.reserve("root.a", {"fpga": 1})
    big = ledger.reserve("root.a", {"memory": "1Ei"})
    assert big.resources == {"memory": 2**60}


def test_same_key_same_request_returns_the_original_whatever_its_state(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    first, again = ledger.decide_all(
        [
            ledger.prepare_reserve("root.a", {"fpga": 1, "memory": "1Gi"}, key="req-1", user="sue"),
            ledger.prepare_reserve(
                "root.a", {"memory": "1024Mi", "fpga": "1"}, key="req-1", user="sue", ttl=5
            ),
        ]
    )
    assert isinstance(first, Reservation)
    assert isinstance(again, Reservation)
    assert again.id == first.id
    ledger.commit(first.id)
    after_commit = ledger.reserve("root.a", {"fpga": 1, "memory": "1Gi"}, key="req-1", user="sue")
    assert after_commit.id == first.id
    assert after_commit.state is ReservationState.COMMITTED
    assert ledger.usage("root.a")["fpga"] == Usage(in_use=1, reserved=0, limit=None)


def test_same_key_different_request_is_a_conflict(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    first = ledger.reserve("root.a", {"fpga": 1}, key="req-1")
    with pytest.raises(IdempotencyConflict) as conflict:
        ledger.reserve("root.a", {"fpga": 2}, key="req-1")
    assert conflict.value.reservation_id == first.id
    with pytest.raises(IdempotencyConflict):
        ledger.reserve("root.b", {"fpga": 1}, key="req-1")
    with pytest.raises(IdempotencyConflict):
        ledger.reserve("root.a", {"fpga": 1}, key="req-1", user="bob")
    # Keys are unique per partition, not globally.
    other = ledger.reserve("root.a", {"fpga": 2}, key="req-1", partition="batch")
    assert other.id != first.id
    assert ledger.usage("root.a")["fpga"].reserved == 1


def test_commit_twice_returns_the_committed_reservation(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    r = ledger.reserve("root.a", {"fpga": 2})
    one, two = ledger.decide_all([ledger.prepare_commit(r.id), ledger.prepare_commit(r.id)])
    assert isinstance(one, Reservation)
    assert one == two == ledger.commit(r.id)
    assert ledger.usage("root.a")["fpga"].in_use == 2


def test_wrong_state_transitions_raise_with_the_state(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    committed = ledger.reserve("root.a", {"fpga": 1})
    done, refused = ledger.decide_all(
        [ledger.prepare_commit(committed.id), ledger.prepare_rollback(committed.id)]
    )
    assert isinstance(done, Reservation)
    assert done.state is ReservationState.COMMITTED
    assert isinstance(refused, ReservationStateError)
    assert refused.state is ReservationState.COMMITTED
    with pytest.raises(ReservationStateError) as err:
        ledger.rollback(committed.id)
    assert err.value.state is ReservationState.COMMITTED
    rolled = ledger.reserve("root.a", {"fpga": 1})
    assert ledger.rollback(rolled.id).state is ReservationState.ROLLED_BACK
    assert ledger.rollback(rolled.id).state is ReservationState.ROLLED_BACK
    with pytest.raises(ReservationStateError) as err:
        ledger.commit(rolled.id)
    assert err.value.state is ReservationState.ROLLED_BACK
    assert ledger.usage("root.a")["fpga"] == Usage(in_use=1, reserved=0, limit=None)


def test_commit_after_expiry_is_refused_without_a_sweep(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    ledger.set_limits("root.a", {"fpga": 1})
    r = ledger.reserve("root.a", {"fpga": 1}, ttl=0.05)
    time.sleep(0.1)
    with pytest.raises(ReservationStateError) as err:
        ledger.commit(r.id)
    assert err.value.state is ReservationState.EXPIRED
    assert ledger.get(r.id).state is ReservationState.EXPIRED
    assert ledger.usage("root.a")["fpga"] == Usage(in_use=0, reserved=0, limit=1)
    assert ledger.expire() == 0
    # Rolling back an expired reservation is a no-op that reports its state.
    assert ledger.rollback(r.id).state is ReservationState.EXPIRED


def test_partial_commit_releases_the_rest(path_ledger: QuotaEngine, path_url: URL) -> None:
    ledger = path_ledger
    ledger.set_limits("root.a", {"fpga": 4, "memory": "8Gi"})
    r = ledger.reserve("root.a", {"fpga": 3, "memory": "4Gi"})
    whole = ledger.reserve("root.a", {"memory": "1Gi"})
    done, other = ledger.decide_all(
        [ledger.prepare_commit(r.id, {"fpga": 1}), ledger.prepare_commit(whole.id)]
    )
    assert isinstance(done, Reservation)
    assert isinstance(other, Reservation)
    assert done.committed == {"fpga": 1, "memory": 0}
    assert other.committed == {"memory": GI}
    usage = ledger.usage("root.a")
    assert usage["fpga"] == Usage(in_use=1, reserved=0, limit=4)
    assert usage["memory"] == Usage(in_use=GI, reserved=0, limit=8 * GI)
    assert count_rows(path_url, quota_journal) == 2
    assert ledger.audit() == []


def test_partial_commit_of_more_than_reserved_changes_nothing(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    r = ledger.reserve("root.a", {"fpga": 2})
    with pytest.raises(InvalidCommit):
        ledger.commit(r.id, {"fpga": 3})
    with pytest.raises(InvalidCommit):
        ledger.commit(r.id, {"gpu": 1})
    assert ledger.get(r.id).state is ReservationState.PENDING
    assert ledger.usage("root.a")["fpga"] == Usage(in_use=0, reserved=2, limit=None)


def test_unknown_reservation_id_raises_not_found(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    unknown = "00000000-0000-0000-0000-000000000000"
    for call in (ledger.commit, ledger.rollback, ledger.get):
        with pytest.raises(ReservationNotFound):
            call(unknown)
    decided = ledger.decide_all([ledger.prepare_commit(unknown), ledger.prepare_rollback(unknown)])
    assert [type(o) for o in decided] == [ReservationNotFound, ReservationNotFound]


def test_release_is_never_refused_for_being_over_a_lowered_limit(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    ledger.set_limits("root.a", {"fpga": 4})
    ledger.commit(ledger.reserve("root.a", {"fpga": 4}).id)
    ledger.set_limits("root.a", {"fpga": 1})
    assert ledger.usage("root.a")["fpga"].available == -3
    with pytest.raises(OverQuota):
        ledger.reserve("root.a", {"fpga": 1})
    ledger.release("root.a", {"fpga": 2})
    assert ledger.usage("root.a")["fpga"] == Usage(in_use=2, reserved=0, limit=1)
    ledger.release("root.a", {"fpga": 2})
    ledger.reserve("root.a", {"fpga": 1})


def test_release_of_more_than_in_use_changes_nothing(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    ledger.commit(ledger.reserve("root.a.b", {"fpga": 2, "memory": "1Gi"}).id)
    with pytest.raises(UsageUnderflow) as err:
        ledger.release("root.a.b", {"fpga": 1, "memory": "2Gi"})
    assert err.value.shortfalls == {"memory": (GI, 2 * GI)}
    with pytest.raises(UsageUnderflow):
        ledger.release("root.a", {"fpga": 1})  # in use below root.a, not at root.a itself
    with pytest.raises(UsageUnderflow):
        ledger.release("root.other", {"fpga": 1})
    assert ledger.usage("root.a")["fpga"] == Usage(in_use=2, reserved=0, limit=None)
    assert ledger.usage("root.a")["memory"].in_use == GI


def test_expire_sweeps_only_expired_reservations_in_batches(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    ledger.set_limits("root", {"fpga": 100})
    short = [ledger.reserve(f"root.q{i % 3}", {"fpga": 1}, ttl=0.05) for i in range(7)]
    keep = ledger.reserve("root.q0", {"fpga": 5}, ttl=600)
    time.sleep(0.1)
    assert ledger.expire(batch_size=2) == 7
    assert {ledger.get(r.id).state for r in short} == {ReservationState.EXPIRED}
    assert ledger.get(keep.id).state is ReservationState.PENDING
    assert ledger.usage("root")["fpga"] == Usage(in_use=0, reserved=5, limit=100)
    assert ledger.expire() == 0
    assert ledger.audit() == []


def test_expire_with_max_batches_stops_early_and_loses_nothing(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    for _ in range(5):
        ledger.reserve("root.q", {"fpga": 1}, ttl=0.05)
    time.sleep(0.1)
    assert ledger.expire(batch_size=2, max_batches=1) == 2
    assert ledger.usage("root")["fpga"].reserved == 3
    assert ledger.expire(batch_size=2) == 3
    assert ledger.usage("root")["fpga"].reserved == 0


def test_expire_with_max_rate_paces_the_batches_and_sweeps_them_all(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    for _ in range(6):
        ledger.reserve("root.q", {"fpga": 1}, ttl=0.05)
    time.sleep(0.1)
    started = time.monotonic()
    assert ledger.expire(batch_size=2, max_rate=20) == 6
    assert time.monotonic() - started >= 0.29  # three full batches of 2 at 20 rows/s
    assert ledger.usage("root")["fpga"].reserved == 0
    assert ledger.audit() == []


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), True, "100"])
def test_expire_refuses_a_bad_max_rate_and_sweeps_nothing(ledger: QuotaEngine, bad: object) -> None:
    ledger.reserve("root.q", {"fpga": 1}, ttl=0.05)
    time.sleep(0.1)
    with pytest.raises(InvalidRequest) as refused:
        ledger.expire(max_rate=bad)  # type: ignore[arg-type]
    assert refused.value.field == "max_rate"
    assert ledger.usage("root")["fpga"].reserved == 1


def test_set_limits_none_removes_one_limit_and_leaves_the_others(ledger: QuotaEngine) -> None:
    ledger.set_limits("root.a", {"fpga": 1, "memory": "1Gi"})
    ledger.set_limits("root.a", {"fpga": None, "vcore": "500m"})
    assert ledger.limits() == {"root.a": {"memory": GI, "vcore": 500}}
    ledger.reserve("root.a", {"fpga": 10})


def test_new_limit_counts_usage_already_in_its_subtree(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    ledger.commit(ledger.reserve("root.a.x", {"fpga": 2}).id)
    ledger.reserve("root.a.y", {"fpga": 1})
    ledger.reserve("root.ab", {"fpga": 7})  # not below root.a
    ledger.set_limits("root.a", {"fpga": 4})
    assert ledger.usage("root.a")["fpga"] == Usage(in_use=2, reserved=1, limit=4)
    ledger.reserve("root.a.z", {"fpga": 1})
    with pytest.raises(OverQuota):
        ledger.reserve("root.a", {"fpga": 1})
    assert ledger.audit() == []


def test_usage_reports_the_whole_subtree_and_nothing_beside_it(ledger: QuotaEngine) -> None:
    ledger.reserve("root.a", {"fpga": 1})
    ledger.reserve("root.a.b", {"fpga": 2})
    ledger.reserve("root.a.b.c", {"memory": "1Ki"})
    ledger.reserve("root.ab", {"fpga": 4})
    ledger.reserve("root.a_b", {"fpga": 8})
    usage = ledger.usage("root.a")
    assert usage == {
        "fpga": Usage(in_use=0, reserved=3, limit=None),
        "memory": Usage(in_use=0, reserved=1024, limit=None),
    }
    assert ledger.usage("root")["fpga"].reserved == 15
    assert ledger.usage("root.nothing") == {}


def test_partitions_are_isolated(path_ledger: QuotaEngine) -> None:
    ledger = path_ledger
    ledger.set_limits("root.a", {"fpga": 1}, partition="gpu")
    ledger.reserve("root.a", {"fpga": 5})
    ledger.reserve("root.a", {"fpga": 1}, partition="gpu")
    with pytest.raises(OverQuota):
        ledger.reserve("root.a", {"fpga": 1}, partition="gpu")
    assert ledger.usage("root.a")["fpga"].reserved == 5
    assert ledger.usage("root.a", partition="gpu")["fpga"] == Usage(in_use=0, reserved=1, limit=1)


@pytest.mark.parametrize(
    ("queue", "resources", "kwargs", "error"),
    [
        ("root.a", {"fpga": "-1"}, {}, InvalidQuantity),
        ("root.a", {"fpga": "1.5.0"}, {}, InvalidQuantity),
        ("root.a", {"memory": ""}, {}, InvalidQuantity),
        ("root.a", {"memory": "9223372036854775808"}, {}, InvalidQuantity),
        ("root.a", {"fpga": 1.5}, {}, InvalidQuantity),
        ("root.a", {"bad name!": 1}, {}, InvalidRequest),
        ("project-a", {"fpga": 1}, {}, InvalidRequest),
        ("root..a", {"fpga": 1}, {}, InvalidRequest),
        ("root.a", {"fpga": 1}, {"ttl": 0}, InvalidRequest),
        ("root.a", {"fpga": 1}, {"ttl": "soon"}, InvalidRequest),
        ("root.a", {"fpga": 1}, {"partition": "no spaces"}, InvalidRequest),
        ("root.a", {"fpga": 1}, {"groups": "dev"}, InvalidRequest),
    ],
)
def test_bad_input_raises_a_typed_error_and_changes_nothing(
    ledger: QuotaEngine, queue: str, resources: dict[str, object], kwargs: dict[str, object], error: type
) -> None:
    ledger.reserve("root.a", {"fpga": 1})
    with pytest.raises(error):
        ledger.reserve(queue, resources, **kwargs)  # type: ignore[arg-type]
    assert ledger.usage("root") == {"fpga": Usage(in_use=0, reserved=1, limit=None)}


def test_invalid_quantity_names_the_resource_and_the_text(ledger: QuotaEngine) -> None:
    with pytest.raises(InvalidQuantity) as err:
        ledger.set_limits("root.a", {"memory": "12Q"})
    assert (err.value.resource, err.value.text) == ("memory", "12Q")
    assert ledger.limits() == {}


def test_audit_finds_and_fixes_drift(ledger: QuotaEngine, db_url: URL) -> None:
    ledger.set_limits("root.a", {"fpga": 10})
    ledger.commit(ledger.reserve("root.a.b", {"fpga": 3}).id)
    ledger.reserve("root.a.b", {"fpga": 2})
    assert ledger.audit() == []
    engine = create_engine(normalize_url(db_url))
    with engine.begin() as conn:
        conn.execute(update(quota_usages).where(quota_usages.c.scope_type == "subtree").values(in_use=9))
        conn.execute(update(quota_usages).where(quota_usages.c.scope == "root.a.b").values(reserved=0))
    engine.dispose()
    drifts = {(d.scope_type, d.scope): d for d in ledger.audit()}
    assert set(drifts) == {("subtree", "root.a"), ("queue", "root.a.b")}
    assert (drifts[("subtree", "root.a")].in_use, drifts[("subtree", "root.a")].expected_in_use) == (9, 3)
    assert drifts[("queue", "root.a.b")].expected_reserved == 2
    fixed = ledger.audit(fix=True)
    assert all(d.fixed for d in fixed)
    assert len(fixed) == 2
    assert ledger.audit() == []
    assert ledger.usage("root.a")["fpga"] == Usage(in_use=3, reserved=2, limit=10)


def test_check_constraints_forbid_negative_usage(ledger: QuotaEngine, db_url: URL) -> None:
    ledger.reserve("root.a", {"fpga": 1})
    engine = create_engine(normalize_url(db_url))
    try:
        with pytest.raises(Exception, match=r"(?i)check|constraint"), engine.begin() as conn:
            conn.execute(text("UPDATE quota_usages SET reserved = -1"))
    finally:
        engine.dispose()
    assert ledger.usage("root.a")["fpga"].reserved == 1


def test_concurrent_sweepers_expire_each_reservation_once(server_db_url: URL) -> None:
    import threading

    engines = [QuotaEngine.from_url(server_db_url) for _ in range(4)]
    try:
        setup = engines[0]
        setup.set_limits("root", {"fpga": 10_000})
        for i in range(120):
            setup.reserve(f"root.q{i % 7}", {"fpga": 1, "memory": "1Ki"}, ttl=0.05)
        time.sleep(0.1)
        counts: list[int] = []
        start = threading.Barrier(len(engines))

        def sweep(engine: QuotaEngine) -> None:
            start.wait()
            counts.append(engine.expire(batch_size=10))

        threads = [threading.Thread(target=sweep, args=(e,)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(counts) == 120
        assert setup.usage("root")["fpga"] == Usage(in_use=0, reserved=0, limit=10_000)
        assert setup.audit() == []
    finally:
        for engine in engines:
            engine.close()
