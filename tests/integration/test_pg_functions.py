"""The PostgreSQL functions a request alone meets (``quota_ledger_reserve_many`` and
``quota_ledger_commit_many`` for one request, the expiry batch): what they decide and what they
decline.

Path-specific, and so here: which calls go to a function (a plain pair is two calls; first uses
and tracked reservations run in the function), which ones it declines to the general path and
why (a refusal, an existing key, a configuration version the engine has not compiled, a
reservation that is not pending, an admission rule), how its expiry batch takes the oldest
queues whole and skips a queue another sweeper holds, and that a schema without the functions
is found once and left alone. What the ledger decides, whichever decides it, is tested on
every decision path (``test_engine.py``, ``test_story_rows.py``, ``test_first_uses.py`` and
the batch tests).
"""

from __future__ import annotations

import threading
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
from quota_ledger.driver import pg_functions
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
            if not rows:  # a set function declines with no row (the expiry function with QL001)
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


def test_a_plain_pair_is_two_calls_and_nothing_declined(ledger: QuotaEngine, calls: Calls) -> None:
    reservation = ledger.reserve("root.a", {"fpga": 1}, ttl=60)
    done = ledger.commit(reservation.id)
    assert calls.made == ["quota_ledger_reserve_many", "quota_ledger_commit_many"]
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
    assert calls.declined == ["quota_ledger_reserve_many"]
    assert rows(postgres_url, "SELECT state, count(*) FROM reservations GROUP BY state ORDER BY state") == [
        ("committed", 1),
        ("rolled_back", 1),  # the fixture's
    ]
    assert ledger.usage("root.a")["fpga"].reserved == 0


def test_a_new_queue_gets_its_counters_in_the_function(ledger: QuotaEngine, calls: Calls) -> None:
    first = ledger.reserve("root.a.fresh", {"fpga": 1})
    second = ledger.reserve("root.a.fresh", {"fpga": 1})
    assert calls.declined == []
    assert calls.made == ["quota_ledger_reserve_many", "quota_ledger_reserve_many"]
    assert {first.state, second.state} == {ReservationState.PENDING}
    assert ledger.usage("root.a")["fpga"].reserved == 2


def test_keys_stay_idempotent(ledger: QuotaEngine, calls: Calls) -> None:
    first = ledger.reserve("root.a", {"fpga": 1}, key="job-1")
    again = ledger.reserve("root.a", {"fpga": 1}, key="job-1")
    assert again.id == first.id
    with pytest.raises(IdempotencyConflict):
        ledger.reserve("root.a", {"fpga": 2}, key="job-1")
    assert ledger.usage("root.a")["fpga"].reserved == 1
    assert calls.declined == ["quota_ledger_reserve_many", "quota_ledger_reserve_many"]


def test_a_configuration_change_is_seen(ledger: QuotaEngine, postgres_url: URL, calls: Calls) -> None:
    ledger.reserve("root.a", {"fpga": 1})
    other = QuotaEngine.from_url(postgres_url)
    try:
        other.set_limits("root.a", {"fpga": 1})  # a new version the first engine has not compiled
    finally:
        other.close()
    with pytest.raises(OverQuota):
        ledger.reserve("root.a", {"fpga": 1})
    assert calls.declined == ["quota_ledger_reserve_many"]
    ledger.set_limits("root.a", {"fpga": 4})
    ledger.reserve("root.a", {"fpga": 1})
    assert calls.declined == ["quota_ledger_reserve_many"]  # compiled again: plain again


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
    assert calls.declined.count("quota_ledger_commit_many") == 3
    assert ledger.usage("root.a")["fpga"].reserved == 0
    assert ledger.audit() == []


def test_an_application_starts_reserves_and_commits_in_the_functions(
    ledger: QuotaEngine, calls: Calls
) -> None:
    first = ledger.reserve("root.a", {"fpga": 1}, user="alice", groups=["dev"], application="app-1")
    ledger.commit(first.id)
    second = ledger.reserve("root.a", {"fpga": 2}, user="alice", groups=["dev"], application="app-1")
    done = ledger.commit(second.id)
    assert calls.declined == []
    assert calls.made == ["quota_ledger_reserve_many", "quota_ledger_commit_many"] * 2
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
    with ledger.driver.engine.begin() as conn:  # (an engine needs the schema at head otherwise)
        found = conn.execute(
            text("SELECT oid::regprocedure::text FROM pg_proc WHERE proname LIKE 'quota_ledger%'")
        )
        for function in found.scalars().all():
            conn.execute(text(f"DROP FUNCTION {function}"))
    reservation = ledger.reserve("root.a", {"fpga": 1})
    assert ledger.commit(reservation.id).state is ReservationState.COMMITTED
    assert ledger.driver.functions is False
    assert calls.made == ["quota_ledger_reserve_many"]  # found missing once, then never tried again
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
    reserve, commit = "quota_ledger_reserve_many", "quota_ledger_commit_many"
    assert calls.made == [reserve, commit, reserve]
    assert ledger.resource_quota_status("team", "pods")["used"] == {"pods": "1", "requests.cpu": "500m"}
    assert ledger.resource_quota_status("team", "all")["used"] == {"pods": "2"}
    ledger.reserve_pod(kube_pod("u3"))
    with pytest.raises(OverQuota) as refused:  # a third high pod: the function declines, the
        ledger.reserve_pod(kube_pod("u4"))  # general path names the quota
    assert [(v.scope, v.resource) for v in refused.value.violations] == [("team/pods", "pods")]
    assert calls.declined == ["quota_ledger_reserve_many"]
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


# -- first uses (migration 0010) ---------------------------------------------------------------
FIRST_USES = """
partitions:
- name: default
  queues:
  - name: root
    queues:
    - name: org
      maxapplications: 10
      resources: {max: {fpga: 40, memory: 40Gi}}
      limits:
      - users: ["*"]
        maxresources: {fpga: 6, memory: 8Gi}
        maxapplications: 2
      - groups: [dev]
        maxresources: {fpga: 10}
      - groups: ["*"]
        maxresources: {fpga: 12, memory: 6Gi}
        maxapplications: 3
      queues:
      - name: team
        maxapplications: 4
        resources: {max: {fpga: 20}}
        limits:
        - users: ["*"]
          maxresources: {fpga: 5}
          maxapplications: 2
"""


@pytest.fixture
def first_uses(postgres_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(postgres_url, pool_size=10)
    engine.apply_config(FIRST_USES)
    yield engine
    engine.close()


def test_first_uses_run_in_the_function_and_only_refusals_are_declined(
    first_uses: QuotaEngine, calls: Calls
) -> None:
    ledger = first_uses
    ledger.reserve("root.org.new", {"fpga": 1, "memory": "1Gi"})  # a new queue
    ledger.reserve("root.org.team.x", {"fpga": 1}, user="ann", groups=["dev"])  # a new user's bucket
    ledger.reserve("root.org.team", {"fpga": 2}, user="ann", groups=["dev"], application="a1")  # a new app
    ledger.reserve("root.org", {"memory": "1Gi"}, user="bob", groups=["ops"], application="b1")  # a new group
    assert calls.made == ["quota_ledger_reserve_many"] * 4
    assert calls.declined == []
    refusals: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("root.org.big", {"fpga": 41}, {}),  # a new queue over the limit of its parent
        ("root.org.team", {"fpga": 6}, {"user": "dan", "groups": ["dev"]}),  # a new user over the copy
        ("root.org", {"memory": "7Gi"}, {"user": "eve", "groups": ["z"], "application": "e1"}),  # a new group
    ]
    for queue, resources, options in refusals:
        with pytest.raises(OverQuota):
            ledger.reserve(queue, resources, **options)
    assert calls.declined == ["quota_ledger_reserve_many"] * 3  # then the general path refused each
    assert ledger.audit() == []


def test_concurrent_first_uses_of_one_queue_are_decided_in_the_function(
    first_uses: QuotaEngine, calls: Calls
) -> None:
    ledger = first_uses
    threads = 8
    start = threading.Barrier(threads)
    refused: list[OverQuota] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            start.wait()
            ledger.commit(ledger.reserve("root.org.fresh", {"fpga": 6}).id)  # 8 x 6 under root.org's 40
        except OverQuota as error:
            refused.append(error)
        except BaseException as error:  # reported below
            errors.append(error)

    crew = [threading.Thread(target=run) for _ in range(threads)]
    for t in crew:
        t.start()
    for t in crew:
        t.join(timeout=120)
    assert errors == []
    assert len(refused) == 2
    assert calls.made.count("quota_ledger_reserve_many") >= threads  # more if a call was retried
    # only the refusals reach the general path
    assert calls.declined == ["quota_ledger_reserve_many"] * 2
    assert ledger.usage("root.org")["fpga"].in_use == 36
    assert ledger.audit() == []
