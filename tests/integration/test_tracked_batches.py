"""Tracked requests (a user, groups, an application, a pod under ResourceQuotas) decided
together decide as each would alone, on every decision path.

With batching, a batch decides its tracked reserves and commits together: on MariaDB and SQLite
as sets (each application row written once, each user/group counter charged once with the
sum, a user's copies of a wildcard limit and a new group's made first), on PostgreSQL with its
functions by ``quota_ledger_reserve_many`` and ``quota_ledger_commit_many``, without them by
each request's step in one transaction. Without batching ``decide_all`` decides them one after
another.

Each scenario decides the same requests in two partitions of one configuration: in
``NAME-together`` by one ``decide_all``, and in ``NAME-alone`` one call at a time, in the
batch's order (the requests of one queue together). Both must admit the same requests and
leave the same rows (application rows, queue, user/group and ResourceQuota counters,
reservations, journal), the figures the limits allow, and a clean audit.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

import pytest
from partition_rows import Rows, apps_of, identities_of, partition_rows, without_areas
from sqlalchemy import select, update
from sqlalchemy.engine import URL

from quota_ledger import CounterOverflow, InvalidRequest, OverQuota, QuotaEngine, ReservationState
from quota_ledger.driver.schema import quota_applications, quota_identity_usages, quota_journal, reservations
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.kube import pods
from quota_ledger.model.values import Reservation

GI = 1 << 30
BIGINT_MAX = 9223372036854775807

RESERVES = """
- name: {name}
  queues:
  - name: root
    queues:
    - name: org
      maxapplications: 6
      limits:
      - users: ["*"]
        maxresources: {{fpga: 8, memory: 8Gi}}
        maxapplications: 3
      - groups: [dev]
        maxresources: {{fpga: 10}}
      - groups: ["*"]
        maxresources: {{memory: 6Gi}}
        maxapplications: 4
      queues:
      - name: team
        maxapplications: 6
        resources: {{max: {{fpga: 20}}}}
        limits:
        - users: [ann]
          maxresources: {{fpga: 3}}
          maxapplications: 2
      - name: lab
        maxapplications: 6
    - name: kube
"""
COMMITS = """
- name: {name}
  queues:
  - name: root
    queues:
    - name: org
      limits:
      - users: ["*"]
        maxresources: {{fpga: 40, asic: 40}}
      - groups: [dev]
        maxresources: {{fpga: 60, asic: 60}}
      queues:
      - name: team
        limits:
        - users: [ann]
          maxresources: {{fpga: 30}}
      - name: lab
    - name: plain
"""
COMMIT_SCENARIOS = ("commits", "overflow")


def twins(scenario: str) -> tuple[str, str]:
    return f"{scenario}-together", f"{scenario}-alone"


#: the partitions of one engine each, for the threads
SINGLE = {"apps": RESERVES, "busy": COMMITS}


def configured(engine: QuotaEngine, *scenarios: str) -> QuotaEngine:
    """``engine`` with the partitions of ``scenarios`` configured: the twins of each, or one."""
    partitions: list[str] = []
    for scenario in scenarios:
        if scenario in SINGLE:
            partitions.append(SINGLE[scenario].format(name=scenario))
        else:
            template = COMMITS if scenario in COMMIT_SCENARIOS else RESERVES
            partitions.extend(template.format(name=partition) for partition in twins(scenario))
    engine.apply_config("partitions:" + "".join(partitions))
    return engine


class DecisionPath(Protocol):
    """The conftest's decision path: what these tests ask of it."""

    @property
    def batching(self) -> bool: ...

    def engine(self, url: URL, **options: Any) -> QuotaEngine: ...


@pytest.fixture(autouse=True)
def no_batch_fails(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No set or batch failed and was decided again one request at a time."""
    yield
    assert not [r.getMessage() for r in caplog.get_records("call") if r.name == "quota_ledger.group_commit"]


def warm(engine: QuotaEngine, scenario: str) -> None:
    """The counters of root.org.team and root.org.lab in both twins, both resources named."""
    for partition in twins(scenario):
        for queue in ("root.org.team", "root.org.lab"):
            engine.rollback(engine.reserve(queue, {"fpga": 1, "memory": 1}, partition=partition).id)


def tracked(
    queue: str,
    resources: dict[str, int],
    *,
    user: str | None = None,
    groups: Sequence[str] = (),
    application: str | None = None,
) -> dict[str, Any]:
    return {
        "queue": queue,
        "resources": resources,
        "user": user,
        "groups": groups,
        "application": application,
    }


def same_rows(
    engine: QuotaEngine, url: URL, scenario: str, wanted: list[dict[str, Any]]
) -> tuple[list[type], Rows]:
    """Reserve ``wanted`` together in one twin and one at a time in the other, in the batch's
    order; check both admitted the same and left the same rows. The outcomes' types in that
    order, and the rows."""
    together, alone = twins(scenario)
    ordered = sorted(wanted, key=lambda w: str(w.get("queue", "root.kube")))
    operations = [
        engine.prepare_reserve_pod(w["pod"], partition=together)
        if "pod" in w
        else engine.prepare_reserve(partition=together, **w)
        for w in ordered
    ]
    decided = engine.decide_all(operations)
    one_by_one: list[Any] = []
    for w in ordered:
        try:
            if "pod" in w:
                one_by_one.append(engine.reserve_pod(w["pod"], partition=alone))
            else:
                one_by_one.append(engine.reserve(partition=alone, **w))
        except (OverQuota, InvalidRequest) as error:
            one_by_one.append(error)
    kinds = [type(o) for o in decided]
    assert kinds == [type(o) for o in one_by_one]
    found = partition_rows(url, together)
    assert found == partition_rows(url, alone)
    assert engine.audit() == []
    return kinds, found


# -- reserves ----------------------------------------------------------------------------------
def test_first_uses_of_queues_applications_users_and_groups_decided_together(
    path_ledger: QuotaEngine, path_url: URL
) -> None:
    ledger = configured(path_ledger, "first", "oneapp")
    warm(ledger, "first")
    for partition in twins("first"):  # a running application of ann's with a commit, and one of bob's
        kept = ledger.reserve(
            "root.org.team", {"fpga": 1}, partition=partition, user="ann", groups=["dev"], application="ann-1"
        )
        ledger.commit(kept.id)
        ledger.reserve(
            "root.org.lab",
            {"memory": GI},
            partition=partition,
            user="bob",
            groups=["ops"],
            application="bob-1",
        )
    wanted = [
        tracked("root.org.team", {"fpga": 1}, user="ann", groups=["dev"], application="ann-1"),
        tracked("root.org.lab", {"fpga": 2, "memory": GI}, user="bob", groups=["ops"], application="bob-2"),
        tracked("root.org.lab", {"fpga": 1}, user="cid", groups=["dev", "ops"], application="cid-1"),
        tracked("root.org.lab", {"memory": 2 * GI}, user="bob", groups=["ops"], application="bob-1"),
        tracked("root.org.lab", {"fpga": 1, "memory": GI}, user="bob", groups=["ops"], application="bob-2"),
        tracked("root.org.lab", {"fpga": 1}, user="dee", groups=["qa"]),  # no application: a bucket row
        tracked("root.org.team", {"fpga": 2}),  # plain
        tracked("root.org.lab", {"memory": GI}, user="cid", groups=["dev", "ops"], application="cid-1"),
        tracked("root.org.lab.new", {"fpga": 1}, user="eli", groups=["qa"], application="eli-1"),  # new queue
        tracked("root.org.lab.new", {"fpga": 1}),  # the new queue, plain
        tracked("root.org.team.other", {"memory": 5}),  # another new queue, plain
    ]
    kinds, after = same_rows(ledger, path_url, "first", wanted)
    assert kinds == [Reservation] * len(wanted)
    apps = {row[0]: row for row in after["apps"]}
    assert apps["bob-2"][5:8] == ("running", 2, {"fpga": [0, 3], "memory": [0, 2 * GI]})
    assert apps["bob-1"][6:8] == (2, {"memory": [0, 3 * GI]})
    assert apps["eli-1"][2:5] == ("eli", "root.org.lab.new", "*")
    identity = identities_of(after)
    # bob's copies hold bob-1 (1Gi before, 2Gi here) and bob-2, started here
    assert identity[("user", "bob", "root.org", "memory")] == (0, 5 * GI, 8 * GI)
    assert identity[("user", "bob", "root.org", "applications")] == (2, 0, 3)
    assert identity[("user", "cid", "root.org", "applications")] == (1, 0, 3)
    assert identity[("user", "eli", "root.org", "applications")] == (1, 0, 3)
    assert identity[("group", "dev", "root.org", "fpga")][:2] == (1, 2)  # ann-1 (one committed), cid-1
    # the shared group wildcard tracks bob's and eli's (qa, ops); dee's bucket does not count
    assert identity[("group", "*", "root.org", "applications")] == (3, 0, 4)
    assert identity[("group", "*", "root.org", "memory")] == (0, 5 * GI, 6 * GI)
    assert ("subtree", "root.org", "applications", 5, 0, 6) in after["counters"]  # 2 ran, 3 new
    assert ("queue", "root.org.lab.new", "fpga", 0, 2, None) in after["counters"]

    # several requests of one new application start it once
    warm(ledger, "oneapp")
    wanted = [
        tracked("root.org.lab", {"fpga": 1, "memory": GI}, user="hoy", groups=["dev"], application="hoy-1")
    ]
    wanted *= 4
    wanted.append(tracked("root.org.lab", {"fpga": 1}, user="hoy", groups=["dev"], application="hoy-2"))
    wanted.append(tracked("root.org.lab", {"memory": GI}, user="hoy", groups=["dev"]))  # hoy's bucket
    kinds, after = same_rows(ledger, path_url, "oneapp", wanted)
    assert kinds == [Reservation] * 6
    apps = {row[0]: row for row in after["apps"]}
    assert apps["hoy-1"][5:8] == ("running", 4, {"fpga": [0, 4], "memory": [0, 4 * GI]})
    identity = identities_of(after)
    assert identity[("user", "hoy", "root.org", "applications")] == (2, 0, 3)
    assert identity[("user", "hoy", "root.org", "memory")] == (0, 5 * GI, 8 * GI)
    assert ("subtree", "root.org", "applications", 2, 0, 6) in after["counters"]


def test_tracked_requests_decided_together_are_admitted_exactly_as_the_limits_allow(
    path_ledger: QuotaEngine, path_url: URL
) -> None:
    ledger = configured(path_ledger, "refused", "maxapps", "userlimit")
    # a refused first use in the middle leaves nothing, and the rest are decided
    warm(ledger, "refused")
    wanted = [
        tracked("root.org.lab", {"fpga": 2}, user="amy", groups=["dev"], application="amy-1"),
        tracked("root.org.lab", {"fpga": 5}, user="fay", groups=["dev"], application="fay-1"),
        # fay's second: over her copy of fpga 8, with a group, a queue and a resource's
        # counter no one else needs
        tracked(
            "root.org.lab.fresh", {"fpga": 5, "memory": 1}, user="fay", groups=["new"], application="fay-2"
        ),
        tracked("root.org.lab.zz", {"fpga": 1}, user="gus", groups=["dev"], application="gus-1"),
        tracked("root.org.lab.zz", {"fpga": 1}, user="gus", groups=["dev"], application="gus-1"),
    ]
    kinds, after = same_rows(ledger, path_url, "refused", wanted)
    assert kinds == [Reservation, Reservation, OverQuota, Reservation, Reservation]
    assert [row[0] for row in after["apps"]] == ["amy-1", "fay-1", "gus-1"]
    assert not [row for row in after["identities"] if row[1] == "new"]
    assert not [row for row in after["counters"] if row[1] == "root.org.lab.fresh"]
    identity = identities_of(after)
    assert identity[("user", "fay", "root.org", "fpga")] == (0, 5, 8)
    assert identity[("group", "dev", "root.org", "fpga")] == (0, 2 + 5 + 1 + 1, 10)
    # the first one refused (a new user over the copy made for it): the others are decided
    wanted = [
        tracked("root.org.lab", {"fpga": 9}, user="kay", groups=["new"], application="kay-1"),
        tracked("root.org.lab", {"fpga": 1}, user="kay", groups=["new"], application="kay-1"),
        tracked("root.org.lab", {"fpga": 1}, user="lou", application="lou-1"),
    ]
    kinds, _ = same_rows(ledger, path_url, "refused", wanted)
    assert kinds == [OverQuota, Reservation, Reservation]
    # plain first uses: the refused one's new queue leaves no counter
    wanted = [
        tracked("root.org.team", {"fpga": 1}),
        tracked("root.org.team.big", {"fpga": 21}),  # over root.org.team's 20
        tracked("root.org.team.zz", {"fpga": 1}),
    ]
    kinds, after = same_rows(ledger, path_url, "refused", wanted)
    assert kinds == [Reservation, OverQuota, Reservation]
    assert not [row for row in after["counters"] if row[1] == "root.org.team.big"]

    # maxapplications admits exactly so many new applications
    warm(ledger, "maxapps")
    for partition in twins("maxapps"):  # one of eve's three applications runs already
        ledger.reserve("root.org.lab", {"fpga": 1}, partition=partition, user="eve", application="eve-0")
    # eve-3 is her fourth: over her limit of 3; eve-1 again fits
    wanted = [tracked("root.org.lab", {"fpga": 1}, user="eve", application=f"eve-{n}") for n in (1, 2, 3, 1)]
    kinds, _ = same_rows(ledger, path_url, "maxapps", wanted)
    assert kinds == [Reservation, Reservation, OverQuota, Reservation]
    # root.org's maxapplications of 6 (eve's 3 run): four more users, four new applications
    wanted = [tracked("root.org.lab", {"fpga": 1}, user=f"u{n}", application=f"u{n}-app") for n in range(4)]
    kinds, after = same_rows(ledger, path_url, "maxapps", wanted)
    assert kinds == [Reservation, Reservation, Reservation, OverQuota]
    assert ("subtree", "root.org", "applications", 6, 0, 6) in after["counters"]

    # a user's limit is shared by the requests of one batch: fay is new, her copy of fpga 8
    # is made in it; 2 + 2 + 2 + 2 fill it, the fifth is over
    warm(ledger, "userlimit")
    wanted = [tracked("root.org.lab", {"fpga": 2}, user="fay", application="fay-1") for _ in range(5)]
    wanted.append(tracked("root.org.lab", {"fpga": 1}, user="gus", application="gus-1"))
    kinds, after = same_rows(ledger, path_url, "userlimit", wanted)
    assert kinds == [*[Reservation] * 4, OverQuota, Reservation]
    assert identities_of(after)[("user", "fay", "root.org", "fpga")] == (0, 8, 8)
    # ann's own limit at root.org.team (fpga 3, 2 applications) is below the wildcard's
    wanted = [tracked("root.org.team", {"fpga": 1}, user="ann", application=f"ann-{n}") for n in range(3)]
    kinds, after = same_rows(ledger, path_url, "userlimit", wanted)
    assert kinds == [Reservation, Reservation, OverQuota]
    assert identities_of(after)[("user", "ann", "root.org.team", "applications")] == (2, 0, 2)


def kube_pod(uid: str, *, user: str, application: str, priority: str = "high") -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": uid,
            "namespace": "kube",
            "uid": uid,
            "labels": {"applicationId": application},
            "annotations": {pods.USER_INFO: json.dumps({"user": user, "groups": ["dev"]})},
        },
        "spec": {
            "priorityClassName": priority,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}],
        },
    }


def test_finished_foreign_and_new_resource_requests_and_pods_decided_together(
    path_ledger: QuotaEngine, path_url: URL
) -> None:
    ledger = configured(path_ledger, "finished", "pods")
    warm(ledger, "finished")
    for partition in twins("finished"):
        held = ledger.reserve(
            "root.org.lab", {"fpga": 1}, partition=partition, user="hal", application="hal-1"
        )
        ledger.commit(held.id)
        ledger.release(
            "root.org.lab", {"fpga": 1}, partition=partition, user="hal", application="hal-1", finished=True
        )
    wanted = [
        tracked("root.org.lab", {"fpga": 1}, user="ivy", application="ivy-1"),
        tracked("root.org.lab", {"fpga": 1}, user="hal", application="hal-1"),  # finished: a new run
        tracked("root.org.lab", {"fpga": 1}, user="ivy", application="ivy-1"),
        tracked("root.org.lab", {"fpga": 1, "vcore": 1}, user="jon", application="jon-1"),  # vcore is new
        tracked("root.org.lab", {"fpga": 1}, user="jon", application="jon-1"),  # after its first
        tracked("root.org.lab", {"fpga": 1}, user="kit", application="hal-1"),  # hal-1 is hal's
    ]
    kinds, after = same_rows(ledger, path_url, "finished", wanted)
    assert kinds == [Reservation] * 5 + [InvalidRequest]
    apps = {row[0]: row for row in after["apps"]}
    assert apps["jon-1"][6:8] == (2, {"fpga": [0, 2], "vcore": [0, 1000]})
    assert apps["hal-1"][5:7] == ("running", 1)

    # pods under ResourceQuotas: the fourth high pod is over "pods" (3), the low ones are not
    high = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}
    for partition in twins("pods"):
        for name, hard, spec in (
            ("pods", {"pods": "3", "requests.cpu": "2"}, {"scopeSelector": high}),
            ("all", {"pods": "10"}, {}),
        ):
            manifest = {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": name, "namespace": "kube"},
                "spec": {"hard": hard, **spec},
            }
            ledger.apply_resource_quota(manifest, partition=partition)
        ledger.rollback(
            ledger.reserve_pod(kube_pod("warm", user="w", application="w-1"), partition=partition).id
        )
    wanted = [
        {"pod": kube_pod(f"p{n}", user=user, application=f"{user}-1", priority=priority)}
        for n, (user, priority) in enumerate(
            [
                ("lee", "high"),
                ("lee", "low"),
                ("max", "high"),
                ("max", "high"),
                ("lee", "high"),
                ("max", "low"),
            ]
        )
    ]
    kinds, after = same_rows(ledger, path_url, "pods", wanted)
    assert kinds == [*[Reservation] * 4, OverQuota, Reservation]
    identity = identities_of(after)
    assert identity[("quota", "kube/pods", "root.kube", "pods")][:2] == (3, 0)
    assert identity[("quota", "kube/all", "root.kube", "pods")][:2] == (5, 0)
    assert ledger.resource_quota_status("kube", "pods", partition="pods-together")["used"] == {
        "pods": "3",
        "requests.cpu": "1500m",
    }


# -- commits -----------------------------------------------------------------------------------
# (queue, resources, user, groups, application): several reservations of one application (app-1
# three, app-2 three, the last of them on asic alone), users and groups shared between
# applications, a user's own bucket (no application), a user whose group has no limit, an
# application whose first commit is among them, and plain ones in between
REQUESTS: list[tuple[str, dict[str, int], str | None, list[str], str | None]] = [
    ("root.org.team", {"fpga": 1}, None, [], None),
    ("root.org.team", {"fpga": 2, "asic": 3}, "ann", ["dev"], "app-1"),
    ("root.org.lab", {"fpga": 1}, "bob", ["dev"], "app-2"),
    ("root.org.team", {"fpga": 1, "asic": 1}, "ann", ["dev"], "app-1"),
    ("root.org.team", {"asic": 2}, "ann", ["dev"], None),
    ("root.plain", {"fpga": 1}, None, [], None),
    ("root.org.team", {"fpga": 1}, "ann", ["dev"], None),
    ("root.org.lab", {"fpga": 2}, "carol", ["ops"], "app-3"),
    ("root.org.lab", {"fpga": 1, "asic": 4}, "bob", ["dev"], "app-2"),
    ("root.org.team", {"asic": 1}, "ann", ["dev"], "app-1"),
    ("root.org.lab", {"fpga": 3}, "ann", ["dev"], "app-4"),
    ("root.org.lab", {"asic": 1}, "bob", ["dev"], "app-2"),
    ("root.org.lab", {"fpga": 1}, "carol", ["ops"], "app-5"),
]


def reserve_all(engine: QuotaEngine, partition: str) -> list[Reservation]:
    """REQUESTS reserved in ``partition``, after a first commit of app-1 (in use before the
    batch), app-4 (in use, then released: nothing in use) and app-5 (finished once its last
    request is reserved: it is committed all the same)."""
    for queue, resources, user, groups, application in (
        ("root.org.team", {"fpga": 1, "asic": 1}, "ann", ["dev"], "app-1"),
        ("root.org.lab", {"fpga": 1}, "ann", ["dev"], "app-4"),
        ("root.org.lab", {"fpga": 1}, "carol", ["ops"], "app-5"),
    ):
        first = engine.reserve(
            queue,
            resources,
            user=user,
            groups=groups,
            application=application,
            partition=partition,
            key=f"first-{application}",
        )
        engine.commit(first.id)
    engine.release("root.org.lab", {"fpga": 1}, user="ann", application="app-4", partition=partition)
    made = [
        engine.reserve(
            queue,
            resources,
            user=user,
            groups=groups,
            application=application,
            partition=partition,
            key=f"k{n:02d}",
        )
        for n, (queue, resources, user, groups, application) in enumerate(REQUESTS)
    ]
    engine.release(
        "root.org.lab", {"fpga": 1}, user="carol", application="app-5", finished=True, partition=partition
    )
    return made


def five_seconds_ago(engine: QuotaEngine) -> None:
    """Give every application row and the rows of what was done so far the same times, five
    seconds ago, and no area so far: the areas then grow alike up to a commit."""
    now: datetime = engine.driver.run(lambda tx: tx.db_now())
    then = now - timedelta(seconds=5)
    a, r = quota_applications.c, reservations.c

    def work(tx: LedgerTx) -> None:
        tx.conn.execute(update(quota_applications).values(submitted_at=then, changed_at=then, area="{}"))
        tx.conn.execute(update(quota_applications).where(a.started_at.is_not(None)).values(started_at=then))
        tx.conn.execute(update(quota_applications).where(a.finished_at.is_not(None)).values(finished_at=then))
        tx.conn.execute(update(reservations).where(r.resolved_at.is_not(None)).values(resolved_at=then))
        tx.conn.execute(update(quota_journal).values(created_at=then))

    engine.driver.run(work)


def area(engine: QuotaEngine, partition: str, app_key: str) -> dict[str, Decimal]:
    a = quota_applications.c
    text = engine.driver.run(
        lambda tx: tx.conn.execute(
            select(a.area).where(a.partition == partition, a.app_key == app_key)
        ).scalar_one()
    )
    return {resource: Decimal(value) for resource, value in json.loads(text).items()}


def commit(engine: QuotaEngine, partition: str, made: Sequence[Reservation]) -> list[Any]:
    """Commit ``made``: together in a ``-together`` partition, else one at a time."""
    if partition.endswith("-together"):
        return engine.decide_all([engine.prepare_commit(each.id) for each in made])
    outcomes: list[Any] = []
    for each in made:
        try:
            outcomes.append(engine.commit(each.id))
        except CounterOverflow as error:
            outcomes.append(error)
    return outcomes


def test_tracked_commits_decided_together_leave_the_rows_of_commits_one_at_a_time(
    path_ledger: QuotaEngine, path_url: URL
) -> None:
    ledger = configured(path_ledger, *COMMIT_SCENARIOS)
    made = {partition: reserve_all(ledger, partition) for s in COMMIT_SCENARIOS for partition in twins(s)}
    five_seconds_ago(ledger)
    together, alone = twins("commits")
    assert partition_rows(path_url, together) == partition_rows(path_url, alone)
    outcomes = {partition: commit(ledger, partition, made[partition]) for partition in (together, alone)}
    for decided in outcomes.values():
        assert all(isinstance(c, Reservation) and c.state is ReservationState.COMMITTED for c in decided)
        assert [c.committed for c in decided] == [r[1] for r in REQUESTS]
    found = partition_rows(path_url, together)
    assert without_areas(found) == without_areas(partition_rows(path_url, alone))
    apps = {row[0]: row for row in found["apps"]}
    # app-1: in use for five seconds before the batch, its three commits moved to in use
    assert apps["app-1"][6:8] == (0, {"asic": [6, 0], "fpga": [4, 0]})
    assert apps["app-3"][9] is True  # started by its commit
    for partition in (together, alone):
        assert area(ledger, partition, "app-1")["fpga"] >= 5_000_000  # 1 fpga for 5 s at least
    identity = identities_of(found)
    assert identity[("user", "ann", "root.org", "fpga")] == (1 + 2 + 1 + 1 + 3, 0, 40)
    assert identity[("group", "dev", "root.org", "asic")] == (1 + 3 + 1 + 2 + 4 + 1 + 1, 0, 60)
    assert ledger.audit() == []

    # a commit that would pass the 64-bit range is refused, and the others committed: bob's
    # user counter on root.org has room for app-2's first fpga commit, not its second; its
    # third (asic alone) fits
    d = quota_identity_usages.c
    bobs = (d.kind == "user") & (d.name == "bob") & (d.queue == "root.org") & (d.resource == "fpga")

    def near(delta: int) -> None:
        def work(tx: LedgerTx) -> None:
            tx.conn.execute(
                update(quota_identity_usages)
                .where(bobs, d.partition.in_(twins("overflow")))
                .values(in_use=d.in_use + delta)
            )

        ledger.driver.run(work)

    near(BIGINT_MAX - 1)
    together, alone = twins("overflow")
    outcomes = {partition: commit(ledger, partition, made[partition]) for partition in (together, alone)}
    for decided in outcomes.values():
        assert [n for n, c in enumerate(decided) if isinstance(c, CounterOverflow)] == [8]
    refused = [outcomes[partition][8] for partition in (together, alone)]
    assert [(e.scope, e.resource) for e in refused] == [("root.org", "fpga")] * 2
    assert without_areas(partition_rows(path_url, together)) == without_areas(partition_rows(path_url, alone))
    near(-(BIGINT_MAX - 1))
    assert ledger.audit() == []
    for partition in (together, alone):
        assert ledger.commit(made[partition][8].id).state is ReservationState.COMMITTED
    assert ledger.audit() == []


# -- threads -----------------------------------------------------------------------------------
def reserving_and_committing(engine: QuotaEngine, url: URL, batching: bool) -> None:
    """Six threads reserve and commit tracked requests of three users: every counter and
    application row ends exact."""
    users = ("ann", "bob", "carol")
    threads_n, rounds = 6, 6
    unexpected: list[BaseException] = []
    before = engine.batch_stats

    def caller(n: int) -> None:
        user = users[n % len(users)]
        for k in range(rounds):
            try:
                made = engine.reserve(
                    "root.org.team" if n % 2 else "root.org.lab",
                    {"fpga": 1, "asic": 1 + n % 2},
                    user=user,
                    groups=["dev"],
                    application=None if k % 3 == 2 else f"{user}-{n % 2}",  # or the user's bucket
                    partition="busy",
                )
                assert engine.commit(made.id).state is ReservationState.COMMITTED
            except BaseException as error:  # reported below
                unexpected.append(error)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert unexpected == []
    fpga = threads_n * rounds
    asic = sum((1 + n % 2) * rounds for n in range(threads_n))
    usage = engine.usage("root.org", partition="busy")
    assert {r: (u.in_use, u.reserved) for r, u in usage.items()} == {"fpga": (fpga, 0), "asic": (asic, 0)}
    found = partition_rows(url, "busy")
    identity = identities_of(found)
    for u, user in enumerate(users):
        mine = [n for n in range(threads_n) if n % len(users) == u]
        assert identity[("user", user, "root.org", "fpga")] == (len(mine) * rounds, 0, 40)
        assert identity[("user", user, "root.org", "asic")] == (
            sum((1 + n % 2) * rounds for n in mine),
            0,
            40,
        )
    assert identity[("group", "dev", "root.org", "fpga")] == (fpga, 0, 60)
    apps = apps_of(found)
    assert all(app[5] == 0 and app[8] for app in apps.values())  # nothing pending, all started
    totals = {"fpga": 0, "asic": 0}
    for app in apps.values():
        for resource, (in_use, reserved) in app[6].items():
            assert reserved == 0
            totals[resource] += in_use
    assert totals == {"fpga": fpga, "asic": asic}
    if batching:
        assert engine.batch_stats.largest > 1, (before, engine.batch_stats)


def starting_applications(engines: Sequence[QuotaEngine], batching: bool) -> None:
    """Six threads on two engines start applications of two users under maxapplications:
    each user starts 3 (the wildcard's copy made by whichever comes first), root.org 6 in all."""
    engines[0].rollback(engines[0].reserve("root.org.lab", {"fpga": 1}, partition="apps").id)
    made: list[Reservation] = []
    refused: list[OverQuota] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        engine = engines[n % 2]
        for i in range(5):
            user = f"w{n % 2}"
            try:
                reservation = engine.reserve(
                    f"root.org.lab.q{i % 3}",
                    {"fpga": 1},
                    partition="apps",
                    user=user,
                    groups=["dev"],
                    application=f"{user}-{n}-{i}",
                )
            except OverQuota as error:
                with lock:
                    refused.append(error)
                continue
            with lock:
                made.append(reservation)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(made) == 6
    assert len(refused) == 30 - 6
    assert all(v.resource == "applications" for error in refused for v in error.violations)
    assert sorted(r.user or "" for r in made) == ["w0"] * 3 + ["w1"] * 3
    assert engines[0].usage("root.org", partition="apps")["applications"].in_use == 6
    if batching:
        assert any(engine.batch_stats.largest > 1 for engine in engines)


def test_threads_deciding_tracked_requests_end_exact(
    path_ledger: QuotaEngine, path_url: URL, decision_path: DecisionPath
) -> None:
    ledger = configured(path_ledger, "apps", "busy")
    reserving_and_committing(ledger, path_url, decision_path.batching)
    other = decision_path.engine(path_url, pool_size=8)
    try:
        starting_applications([ledger, other], decision_path.batching)
    finally:
        other.close()
    assert ledger.audit() == []
