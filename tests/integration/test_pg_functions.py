"""The PostgreSQL functions of migrations 0004 and 0010 (reserve, commit, expiry batch).

They must leave exactly the rows the general path leaves, decline whatever is not plain
without a trace, and keep the engine's contract (refusals, idempotency, states) unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sql_rows import rows
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from quota_ledger import (
    IdempotencyConflict,
    MissingCoveringQuota,
    OverQuota,
    QuotaEngine,
    ReservationNotFound,
    ReservationState,
    ReservationStateError,
)
from quota_ledger.driver import migrate, pg_functions
from quota_ledger.driver.dialect import normalize_url


class Calls:
    """Counts the function calls the driver makes and how many were declined."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[str] = []
        self.declined: list[str] = []
        real = pg_functions.call

        def spy(engine: Any, sql: str, params: Any) -> Any:
            name = sql.split("(", 1)[0].rsplit(" ", 1)[-1]
            self.made.append(name)
            rows = real(engine, sql, params)
            if rows is None:
                self.declined.append(name)
            return rows

        monkeypatch.setattr(pg_functions, "call", spy)


@pytest.fixture
def ledger(postgres_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(postgres_url)
    engine.set_limits("root.a", {"fpga": 4, "memory": "8Gi"})
    engine.set_limits("root", {"fpga": 6})
    engine.rollback(engine.reserve("root.a", {"fpga": 1, "memory": 1}).id)  # creates its counters
    yield engine
    engine.close()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    return Calls(monkeypatch)


def snapshot(url: URL, partition: str) -> dict[str, list[tuple[Any, ...]]]:
    """Everything a plain reserve/commit/expire writes, without ids, clock readings and the
    request hashes (which cover the partition's name)."""
    p = f"'{partition}'"
    return {
        "counters": rows(
            url,
            "SELECT scope_type, scope, resource, in_use, reserved, hard_limit FROM quota_usages"
            f" WHERE partition = {p} ORDER BY 1, 2, 3",
        ),
        "reservations": rows(
            url,
            'SELECT r."key", r.state, r.queue, r.user_name, r."groups", r.application,'
            " r.priority_class, r.kube, r.resolved_at IS NULL, r.expires_at - r.created_at,"
            " i.resource, i.amount, i.committed"
            " FROM reservations r JOIN reservation_items i ON i.reservation_id = r.id"
            f" WHERE r.partition = {p} ORDER BY r.queue, r.key, i.resource",
        ),
        "journal": rows(
            url,
            f"SELECT queue, resource, delta, kind FROM quota_journal WHERE partition = {p} ORDER BY 1, 2, 3",
        ),
    }


def story(engine: QuotaEngine, partition: str) -> None:
    """A little of everything a plain caller does."""
    engine.set_limits("root.x", {"fpga": 10, "vcore": "8"}, partition=partition)
    engine.set_limits("root.x.y", {"fpga": 6}, partition=partition)
    kept = engine.reserve("root.x.y", {"fpga": 2, "vcore": "500m"}, partition=partition, key="k1", ttl=300)
    engine.commit(kept.id)
    engine.commit(kept.id)  # twice: returns the committed one
    engine.rollback(engine.reserve("root.x.y", {"fpga": 1}, partition=partition, ttl=300).id)
    engine.reserve("root.x", {"vcore": "1"}, partition=partition, priority_class="high", ttl=300)
    with pytest.raises(OverQuota):
        engine.reserve("root.x.y", {"fpga": 5}, partition=partition)
    engine.release("root.x.y", {"fpga": 1}, partition=partition)


def test_plain_calls_leave_the_rows_the_general_path_leaves(postgres_url: URL, calls: Calls) -> None:
    fast = QuotaEngine.from_url(postgres_url)
    general = QuotaEngine.from_url(postgres_url)
    general.driver.functions = False
    try:
        story(fast, "fast")
        story(general, "general")
    finally:
        fast.close()
        general.close()
    assert {"quota_ledger_reserve", "quota_ledger_commit"} <= set(calls.made)
    assert snapshot(postgres_url, "fast") == snapshot(postgres_url, "general")
    assert snapshot(postgres_url, "fast")["counters"]  # the comparison compared something


def test_a_plain_pair_is_two_calls_and_nothing_declined(ledger: QuotaEngine, calls: Calls) -> None:
    reservation = ledger.reserve("root.a", {"fpga": 1}, ttl=60)
    done = ledger.commit(reservation.id)
    assert calls.made == ["quota_ledger_reserve", "quota_ledger_commit"]
    assert calls.declined == []
    assert done.state is ReservationState.COMMITTED
    assert done.committed == {"fpga": 1}
    assert done.created_at == reservation.created_at
    assert done.expires_at == reservation.expires_at
    assert ledger.get(reservation.id) == done
    assert ledger.usage("root.a")["fpga"].in_use == 1


def test_over_quota_is_declined_and_refused_with_every_violation(
    ledger: QuotaEngine, postgres_url: URL, calls: Calls
) -> None:
    ledger.commit(ledger.reserve("root.a", {"fpga": 3}).id)
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.a", {"fpga": 4, "memory": "9Gi"})
    assert {(v.scope, v.resource) for v in refused.value.violations} == {
        ("root.a", "fpga"),
        ("root", "fpga"),
        ("root.a", "memory"),
    }
    assert calls.declined == ["quota_ledger_reserve"]
    assert rows(postgres_url, "SELECT state, count(*) FROM reservations GROUP BY state ORDER BY state") == [
        ("committed", 1),
        ("rolled_back", 1),  # the fixture's
    ]
    assert ledger.usage("root.a")["fpga"].reserved == 0


def test_a_new_queue_gets_its_counters_in_the_function(ledger: QuotaEngine, calls: Calls) -> None:
    first = ledger.reserve("root.a.fresh", {"fpga": 1})
    second = ledger.reserve("root.a.fresh", {"fpga": 1})
    assert calls.declined == []
    assert calls.made == ["quota_ledger_reserve", "quota_ledger_reserve"]
    assert {first.state, second.state} == {ReservationState.PENDING}
    assert ledger.usage("root.a")["fpga"].reserved == 2


def test_keys_stay_idempotent(ledger: QuotaEngine, calls: Calls) -> None:
    first = ledger.reserve("root.a", {"fpga": 1}, key="job-1")
    again = ledger.reserve("root.a", {"fpga": 1}, key="job-1")
    assert again.id == first.id
    with pytest.raises(IdempotencyConflict):
        ledger.reserve("root.a", {"fpga": 2}, key="job-1")
    assert ledger.usage("root.a")["fpga"].reserved == 1
    assert calls.declined == ["quota_ledger_reserve", "quota_ledger_reserve"]


def test_a_configuration_change_is_seen(ledger: QuotaEngine, postgres_url: URL, calls: Calls) -> None:
    ledger.reserve("root.a", {"fpga": 1})
    other = QuotaEngine.from_url(postgres_url)
    try:
        other.set_limits("root.a", {"fpga": 1})  # a new version the first engine has not compiled
    finally:
        other.close()
    with pytest.raises(OverQuota):
        ledger.reserve("root.a", {"fpga": 1})
    assert calls.declined == ["quota_ledger_reserve"]
    ledger.set_limits("root.a", {"fpga": 4})
    ledger.reserve("root.a", {"fpga": 1})
    assert calls.declined == ["quota_ledger_reserve"]  # compiled again: plain again


def test_commit_states_are_kept(ledger: QuotaEngine, postgres_url: URL, calls: Calls) -> None:
    rolled = ledger.reserve("root.a", {"fpga": 1})
    ledger.rollback(rolled.id)
    with pytest.raises(ReservationStateError) as wrong:
        ledger.commit(rolled.id)
    assert wrong.value.state is ReservationState.ROLLED_BACK
    late = ledger.reserve("root.a", {"fpga": 1}, ttl=60)
    with create_engine(normalize_url(postgres_url)).begin() as conn:
        conn.execute(text("UPDATE reservations SET expires_at = created_at WHERE id = :id"), {"id": late.id})
    with pytest.raises(ReservationStateError) as expired:
        ledger.commit(late.id)
    assert expired.value.state is ReservationState.EXPIRED
    with pytest.raises(ReservationNotFound):
        ledger.commit("no-such-id")
    assert calls.declined.count("quota_ledger_commit") == 3
    assert ledger.usage("root.a")["fpga"].reserved == 0
    assert ledger.audit() == []


TRACKED_CONFIG = """
partitions:
- name: {partition}
  queues:
  - name: root
    queues:
    - name: org
      limits:
      - users: ["*"]
        maxresources: {{fpga: 8, memory: 8Gi}}
        maxapplications: 3
      - groups: [dev]
        maxresources: {{fpga: 10}}
      - groups: ["*"]
        maxresources: {{memory: 6Gi}}
      queues:
      - name: team
        resources: {{max: {{fpga: 20}}}}
        limits:
        - users: [ann]
          maxresources: {{fpga: 3}}
          maxapplications: 2
"""


def tracked_story(engine: QuotaEngine, partition: str) -> None:
    """Applications of two users in two groups: new, running, refused, rolled back, released."""
    # A configuration covers every partition: the second story's replaces the first's.
    engine.apply_config(TRACKED_CONFIG.format(partition=partition), allow_removing_all=True)
    for n in range(3):
        for user, groups in (("ann", ["dev"]), ("bob", ["ops", "qa"])):
            made = engine.reserve(
                "root.org.team",
                {"fpga": 1, "memory": "1Gi"},
                partition=partition,
                user=user,
                groups=groups,
                application=f"{user}-app",
                ttl=300,
            )
            if n == 1:
                engine.rollback(made.id)
            else:
                engine.commit(made.id)
    bucket = engine.reserve("root.org.team", {"fpga": 1}, partition=partition, user="bob", groups=["qa"])
    engine.commit(bucket.id)
    with pytest.raises(OverQuota):  # ann's own limit at root.org.team
        engine.reserve("root.org.team", {"fpga": 2}, partition=partition, user="ann", application="ann-app")
    engine.release(
        "root.org.team", {"fpga": 1}, partition=partition, user="ann", application="ann-app", finished=True
    )


def identity_snapshot(url: URL, partition: str) -> dict[str, list[tuple[Any, ...]]]:
    p = f"'{partition}'"
    apps = rows(
        url,
        'SELECT app_key, application, user_name, queue, group_name, state, pending, "usage", area,'
        " started_at IS NULL, finished_at IS NULL"
        f" FROM quota_applications WHERE partition = {p} ORDER BY app_key",
    )
    return {
        # usage and area are JSON: compare them parsed; the times are the clock's
        "apps": [(*row[:7], json.loads(row[7]), sorted(json.loads(row[8])), *row[9:]) for row in apps],
        "counters": rows(
            url,
            "SELECT kind, name, queue, resource, in_use, reserved, hard_limit FROM quota_identity_usages"
            f" WHERE partition = {p} ORDER BY 1, 2, 3, 4",
        ),
        "summaries": rows(url, f"SELECT application FROM quota_app_summaries WHERE partition = {p}"),
    }


def test_tracked_reservations_leave_the_rows_the_general_path_leaves(postgres_url: URL, calls: Calls) -> None:
    fast = QuotaEngine.from_url(postgres_url)
    general = QuotaEngine.from_url(postgres_url)
    general.driver.functions = False
    try:
        tracked_story(fast, "fast")
        fast_result = {**snapshot(postgres_url, "fast"), **identity_snapshot(postgres_url, "fast")}
        tracked_story(general, "general")
        general_result = {**snapshot(postgres_url, "general"), **identity_snapshot(postgres_url, "general")}
    finally:
        fast.close()
        general.close()
    # ann's and bob's first reservations start their applications (general path), later ones
    # run in the functions
    assert calls.made.count("quota_ledger_reserve") > calls.declined.count("quota_ledger_reserve") >= 2
    assert calls.made.count("quota_ledger_commit") == 5
    assert fast_result == general_result
    assert fast_result["apps"]  # something was compared
    assert fast_result["counters"]
    assert fast.audit(partition="fast") == []


def test_an_application_starts_reserves_and_commits_in_the_functions(
    ledger: QuotaEngine, calls: Calls
) -> None:
    first = ledger.reserve("root.a", {"fpga": 1}, user="alice", groups=["dev"], application="app-1")
    ledger.commit(first.id)
    second = ledger.reserve("root.a", {"fpga": 2}, user="alice", groups=["dev"], application="app-1")
    done = ledger.commit(second.id)
    assert calls.declined == []
    assert calls.made == ["quota_ledger_reserve", "quota_ledger_commit"] * 2
    assert (done.user, done.groups, done.application) == ("alice", ("dev",), "app-1")
    assert ledger.get(second.id) == done
    assert ledger.user_usage("alice")["queues"]["resourceUsage"] == {"fpga": 3}
    assert ledger.audit() == []


def test_expiry_sweeps_plain_and_tracked_reservations(
    ledger: QuotaEngine, postgres_url: URL, calls: Calls
) -> None:
    ledger.set_limits("root.a", {"fpga": 100, "memory": None})
    ledger.set_limits("root", {"fpga": 100})
    for _ in range(23):
        ledger.reserve("root.a", {"fpga": 1, "memory": "1Gi"}, ttl=60)
    for n in range(5):
        ledger.reserve("root.a", {"fpga": 1}, user=f"u{n}", application=f"app-{n}", ttl=60)
    live = ledger.reserve("root.a", {"fpga": 1}, ttl=3600)
    with create_engine(normalize_url(postgres_url)).begin() as conn:
        conn.execute(
            text("UPDATE reservations SET expires_at = created_at WHERE id <> :id AND state = 'pending'"),
            {"id": live.id},
        )
    assert ledger.expire(batch_size=4, workers=3) == 28
    assert "quota_ledger_expire" in calls.made
    assert ledger.usage("root.a")["fpga"].reserved == 1
    assert ledger.usage("root.a")["memory"].reserved == 0
    assert ledger.get(live.id).state is ReservationState.PENDING
    assert rows(postgres_url, "SELECT state, count(*) FROM reservations GROUP BY state ORDER BY state") == [
        ("expired", 28),
        ("pending", 1),
        ("rolled_back", 1),  # the fixture's
    ]
    assert ledger.audit() == []


def test_max_batches_bounds_the_whole_sweep(ledger: QuotaEngine, postgres_url: URL) -> None:
    for _ in range(10):
        ledger.reserve("root.a", {"fpga": 0, "memory": 1}, ttl=60)
    with create_engine(normalize_url(postgres_url)).begin() as conn:
        conn.execute(text("UPDATE reservations SET expires_at = created_at WHERE state = 'pending'"))
    assert ledger.expire(batch_size=3, max_batches=2, workers=2) == 6
    assert ledger.expire(batch_size=3) == 4


def stale(ledger: QuotaEngine, url: URL, queues: list[str]) -> None:
    """One plain reservation in each of ``queues``, expired in that order (oldest first)."""
    for queue in ["root", *sorted(set(queues))]:
        ledger.set_limits(queue, {"fpga": 100})
    made = [ledger.reserve(queue, {"fpga": 1}, ttl=60).id for queue in queues]
    with create_engine(normalize_url(url)).begin() as conn:
        for rank, rid in enumerate(made):
            conn.execute(
                text(
                    "UPDATE reservations SET expires_at = created_at - make_interval(secs => 1000 - :n)"
                    " WHERE id = :id"
                ),
                {"id": rid, "n": rank},
            )


def expired(url: URL) -> list[tuple[str, int]]:
    return rows(
        url, "SELECT queue, count(*) FROM reservations WHERE state = 'expired' GROUP BY queue ORDER BY queue"
    )


def test_a_batch_takes_the_oldest_queues_whole(ledger: QuotaEngine, postgres_url: URL, calls: Calls) -> None:
    stale(ledger, postgres_url, ["root.q1", "root.q2", "root.q3"] * 3)
    # the 4 oldest are in q1 q2 q3 q1: all of q1 (3), then q2's oldest fills the batch
    calls.made.clear()
    assert ledger.expire(batch_size=4, max_batches=1) == 4
    assert calls.made == ["quota_ledger_expire"]
    assert expired(postgres_url) == [("root.q1", 3), ("root.q2", 1)]
    assert ledger.usage("root.q1")["fpga"].reserved == 0
    assert ledger.usage("root.q2")["fpga"].reserved == 2
    assert ledger.expire(batch_size=4) == 5
    assert ledger.audit() == []


def test_a_batch_fills_up_past_a_queue_another_sweeper_holds(ledger: QuotaEngine, postgres_url: URL) -> None:
    stale(ledger, postgres_url, ["root.q1", "root.q1", "root.q1", "root.q2", "root.q3"])
    other = create_engine(normalize_url(postgres_url))
    try:
        with other.begin() as conn:  # another sweeper's batch holds all of q1
            held = conn.execute(
                text("SELECT id FROM reservations WHERE queue = 'root.q1' AND state = 'pending' FOR UPDATE")
            ).all()
            assert len(held) == 3
            # the 3 oldest are all in q1, which is skipped: the batch takes the rest instead
            assert ledger.expire(batch_size=3, max_batches=1) == 2
    finally:
        other.dispose()
    assert expired(postgres_url) == [("root.q2", 1), ("root.q3", 1)]
    assert ledger.expire() == 3
    assert ledger.audit() == []


def test_a_schema_without_the_functions_uses_the_general_path(ledger: QuotaEngine, calls: Calls) -> None:
    migrate.downgrade(ledger.driver.engine, "0003")
    reservation = ledger.reserve("root.a", {"fpga": 1})
    assert ledger.commit(reservation.id).state is ReservationState.COMMITTED
    assert ledger.driver.functions is False
    assert calls.made == ["quota_ledger_reserve"]  # found missing once, then never tried again
    assert ledger.usage("root.a")["fpga"].in_use == 1


def kube_pod(uid: str, *, priority: str | None = "high", cpu: str = "500m") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if priority:
        spec["priorityClassName"] = priority
    return {"kind": "Pod", "metadata": {"name": uid, "namespace": "team", "uid": uid}, "spec": spec}


def resource_quota(name: str, hard: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"hard": hard, **spec},
    }


HIGH_ONLY = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}


def test_pods_under_resource_quotas_are_charged_by_the_function(ledger: QuotaEngine, calls: Calls) -> None:
    ledger.apply_resource_quota(
        resource_quota("pods", {"pods": "2", "requests.cpu": "2"}, scopeSelector=HIGH_ONLY)
    )
    ledger.apply_resource_quota(resource_quota("all", {"pods": "10"}))
    ledger.rollback(ledger.reserve_pod(kube_pod("warm")).id)  # creates the queue's counters
    calls.made.clear()
    calls.declined.clear()
    first = ledger.reserve_pod(kube_pod("u1"))
    ledger.commit(first.id)
    ledger.reserve_pod(kube_pod("u2", priority="low"))  # matches "all" only
    assert calls.declined == []
    assert calls.made == ["quota_ledger_reserve", "quota_ledger_commit", "quota_ledger_reserve"]
    assert ledger.resource_quota_status("team", "pods")["used"] == {"pods": "1", "requests.cpu": "500m"}
    assert ledger.resource_quota_status("team", "all")["used"] == {"pods": "2"}
    ledger.reserve_pod(kube_pod("u3"))
    with pytest.raises(OverQuota) as refused:  # a third high pod: the function declines, the
        ledger.reserve_pod(kube_pod("u4"))  # general path names the quota
    assert [(v.scope, v.resource) for v in refused.value.violations] == [("team/pods", "pods")]
    assert calls.declined == ["quota_ledger_reserve"]
    assert ledger.resource_quota_status("team", "pods")["used"] == {"pods": "2", "requests.cpu": "1"}
    assert ledger.audit() == []


def test_admission_refusals_are_left_to_the_general_path(ledger: QuotaEngine, calls: Calls) -> None:
    ledger.apply_admission_config(
        {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "ResourceQuotaConfiguration",
            "limitedResources": [{"resource": "pods", "matchScopes": [HIGH_ONLY["matchExpressions"][0]]}],
        }
    )
    with pytest.raises(MissingCoveringQuota):
        ledger.reserve_pod(kube_pod("u1"))
    assert calls.made == []
    ledger.apply_resource_quota(resource_quota("pods", {"pods": "5"}, scopeSelector=HIGH_ONLY))
    ledger.reserve_pod(kube_pod("u2"))
    assert ledger.resource_quota_status("team", "pods")["used"] == {"pods": "1"}
