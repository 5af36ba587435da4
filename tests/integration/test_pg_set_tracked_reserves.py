"""``quota_ledger_reserve_many`` with tracked requests: users, groups and applications (new and
running), user/group limits (a user's copy of a wildcard limit made on first use) and
ResourceQuota charges.

Path-specific, and so here: which requests the set call itself admits and which it sets aside
for their own calls (``together`` below, against ``admitted``: what the batch admits in all),
called directly as a batch calls it (the set call, then each request it declined by its own
call, in order), and that a batch hands its tracked reserves to one set call. What a batch of
tracked requests admits and the rows it leaves are tested on every decision path
(``test_tracked_batches.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from sql_rows import rows
from sqlalchemy.engine import URL

from quota_ledger import OverQuota, QuotaEngine, Reservation
from quota_ledger.driver import pg_functions
from quota_ledger.driver.pg_cursor import Call, PgCursor
from quota_ledger.kube import pods
from quota_ledger.ledger import reserve_function
from quota_ledger.model import requests
from quota_ledger.model.requests import ReserveRequest

PARTITION = """
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
CONFIG = "partitions:" + PARTITION.format(name="set")
GI = 1 << 30


@pytest.fixture
def ledger(postgres_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(postgres_url)
    engine.apply_config(CONFIG)
    for queue in ("root.org.team", "root.org.lab"):  # the queues' counters, both resources named
        made = engine.reserve(queue, {"fpga": 1, "memory": 1}, partition="set")
        engine.rollback(made.id)
    yield engine
    engine.close()


def params(engine: QuotaEngine, request: ReserveRequest) -> dict[str, Any]:
    """The parameters of a request's own call, as a batch collects them."""
    known = engine.driver.run(lambda tx: engine.rules.known(lambda step: step(tx)))
    charges = reserve_function.quota_charges(known, request)
    assert charges is not None
    return pg_functions.reserve_params(
        request, known.version, charges, reserve_function.identity_of(known, request)
    )


def tracked(
    queue: str,
    resources: dict[str, int],
    *,
    user: str | None = None,
    groups: Sequence[str] = (),
    application: str | None = None,
) -> dict[str, Any]:
    """A request, to be built once per partition."""
    return {
        "queue": queue,
        "resources": resources,
        "user": user,
        "groups": groups,
        "application": application,
    }


def build(engine: QuotaEngine, partition: str, wanted: Mapping[str, Any]) -> dict[str, Any]:
    if "pod" in wanted:
        pod = pods.parse_pod(wanted["pod"])
        request = requests.build(
            partition=partition,
            queue=engine.namespace_queue(pod.namespace, partition=partition),
            resources=pod.resources,
            user=pod.user,
            groups=pod.groups,
            application=pod.application,
            ttl=300,
            default_ttl=300.0,
            key=f"{partition}-{pod.uid}",
            kube={"usage": pod.usage, "scopes": pod.scopes.as_dict()},
            namespace=pod.namespace,
            missing={"requests": pod.missing_requests, "limits": pod.missing_limits},
        )
    else:
        request = requests.build(
            partition=partition,
            ttl=300,
            default_ttl=300.0,
            key=None,
            kube={"usage": {}, "scopes": {"priorityClass": None}},
            namespace="none",
            **wanted,
        )
    return params(engine, request)


def as_a_batch(engine: QuotaEngine, calls: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Reserve as a batch then its requests alone do: the set call, then each request it
    declined by a call of its own. The places (1-based) the set call admitted, and those
    admitted in all."""

    def call(of: list[dict[str, Any]]) -> list[Any]:
        made = pg_functions.reserve_many(of)
        answer = engine.driver.call(made.sql, made.params)
        assert answer is not None, "a set function never declines the whole call"
        return answer

    together = sorted(row.idx for row in call(calls))
    alone = [n for n, c in enumerate(calls, 1) if n not in together and call([c])]
    return together, sorted(together + alone)


def snapshot(url: URL, partition: str) -> dict[str, list[tuple[Any, ...]]]:
    """What a reserve writes, without ids, clock readings and request hashes."""
    p = {"p": partition}
    apps = rows(
        url,
        'SELECT app_key, application, user_name, queue, group_name, state, pending, "usage", area'
        " FROM quota_applications WHERE partition = :p ORDER BY app_key",
        p,
    )
    return {
        "apps": [(*row[:7], json.loads(row[7]), sorted(json.loads(row[8]))) for row in apps],
        "identity": rows(
            url,
            "SELECT kind, name, queue, resource, in_use, reserved, hard_limit FROM quota_identity_usages"
            " WHERE partition = :p ORDER BY 1, 2, 3, 4",
            p,
        ),
        "reservations": rows(
            url,
            'SELECT r.state, r.queue, r.user_name, r."groups", r.application, r.priority_class, r.kube,'
            " i.resource, i.amount FROM reservations r JOIN reservation_items i ON i.reservation_id = r.id"
            " WHERE r.partition = :p ORDER BY 1, 2, 3, 4, 5, 6, 7, 8, 9",
            p,
        ),
    }


def decided(engine: QuotaEngine, wanted: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Reserve ``wanted`` in partition ``set`` as a batch does; the places the set call
    admitted, and those admitted in all. The audit stays clean."""
    together, admitted = as_a_batch(engine, [build(engine, "set", w) for w in wanted])
    assert engine.audit() == []
    return together, admitted


def test_new_and_running_applications_new_users_and_groups(ledger: QuotaEngine) -> None:
    # a running application of ann's with a commit, and one of bob's
    kept = ledger.reserve(
        "root.org.team", {"fpga": 1}, partition="set", user="ann", groups=["dev"], application="ann-1"
    )
    ledger.commit(kept.id)
    ledger.reserve(
        "root.org.lab", {"memory": GI}, partition="set", user="bob", groups=["ops"], application="bob-1"
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
    ]
    together, admitted = decided(ledger, wanted)
    # new and running applications, new users' copies and a new group's: all in the set call
    assert together == admitted == list(range(1, 9))


def test_a_maxapplications_limit_admits_exactly_so_many_new_applications(ledger: QuotaEngine) -> None:
    # one of eve's three applications runs already
    ledger.reserve("root.org.lab", {"fpga": 1}, partition="set", user="eve", application="eve-0")
    wanted = [tracked("root.org.lab", {"fpga": 1}, user="eve", application=f"eve-{n}") for n in (1, 2, 3)]
    # eve-3 is her fourth: over her limit of 3, it ends the prefix; eve-1 again would fit, but
    # comes after it and is decided by its own call
    wanted.append(tracked("root.org.lab", {"fpga": 1}, user="eve", application="eve-1"))
    together, admitted = decided(ledger, wanted)
    assert together == [1, 2]
    assert admitted == [1, 2, 4]
    # root.org's maxapplications of 6 (eve's 3 run): three more users, four new applications
    wanted = [tracked("root.org.lab", {"fpga": 1}, user=f"u{n}", application=f"u{n}-app") for n in range(4)]
    together, admitted = decided(ledger, wanted)
    assert together == admitted == [1, 2, 3]


def test_a_user_limit_is_shared_by_the_requests_of_one_call(ledger: QuotaEngine) -> None:
    # fay is new: her copy of fpga 8 is made in the call; 2 + 2 + 2 + 2 fill it, the fifth is over
    wanted = [tracked("root.org.lab", {"fpga": 2}, user="fay", application="fay-1") for _ in range(5)]
    wanted.append(tracked("root.org.lab", {"fpga": 1}, user="gus", application="gus-1"))
    together, admitted = decided(ledger, wanted)
    assert together == [1, 2, 3, 4]
    assert admitted == [1, 2, 3, 4, 6]
    # ann's own limit at root.org.team (fpga 3, 2 applications) is below the wildcard's
    wanted = [tracked("root.org.team", {"fpga": 1}, user="ann", application=f"ann-{n}") for n in range(3)]
    together, admitted = decided(ledger, wanted)
    assert together == admitted == [1, 2]


def test_a_finished_application_is_set_aside_without_holding_back_the_rest(ledger: QuotaEngine) -> None:
    held = ledger.reserve("root.org.lab", {"fpga": 1}, partition="set", user="hal", application="hal-1")
    ledger.commit(held.id)
    ledger.release(
        "root.org.lab", {"fpga": 1}, partition="set", user="hal", application="hal-1", finished=True
    )
    wanted = [
        tracked("root.org.lab", {"fpga": 1}, user="ivy", application="ivy-1"),
        tracked("root.org.lab", {"fpga": 1}, user="hal", application="hal-1"),  # finished: declined
        tracked("root.org.lab", {"fpga": 1}, user="ivy", application="ivy-1"),
    ]
    together, admitted = decided(ledger, wanted)
    assert together == admitted == [1, 3]


def test_a_second_request_of_a_new_application_waits_for_its_first(
    ledger: QuotaEngine, postgres_url: URL
) -> None:
    # jon's first request names a resource the partition does not know: set aside (the general
    # path decides it), so is his second, which would otherwise start the application
    wanted = [
        tracked("root.org.lab", {"fpga": 1, "vcore": 1}, user="jon", application="jon-1"),
        tracked("root.org.lab", {"fpga": 1}, user="jon", application="jon-1"),
        tracked("root.org.lab", {"fpga": 1}, user="kim", application="kim-1"),
        tracked("root.org.team", {"fpga": 21}),  # over root.org.team: ends the prefix
        tracked("root.org.lab", {"fpga": 1}, user="zoe", application="zoe-1"),
    ]
    calls = [build(ledger, "set", w) for w in wanted]
    made = pg_functions.reserve_many(calls)
    answer = ledger.driver.call(made.sql, made.params)
    assert answer is not None
    assert [row.idx for row in answer] == [3]
    after = snapshot(postgres_url, "set")
    assert [row[0] for row in after["apps"]] == ["kim-1"]
    # zoe's application row and copies, made before the counters were locked, are gone again
    names = {row[1] for row in after["identity"]}
    assert "kim" in names
    assert "zoe" not in names
    assert "jon" not in names
    assert [row[:5] for row in after["reservations"] if row[0] == "pending"] == [
        ("pending", "root.org.lab", "kim", None, "kim-1")
    ]
    assert ledger.audit() == []


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


def test_resource_quota_charges(ledger: QuotaEngine) -> None:
    high = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}
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
        ledger.apply_resource_quota(manifest, partition="set")
    ledger.rollback(ledger.reserve_pod(kube_pod("warm", user="w", application="w-1"), partition="set").id)
    wanted: list[dict[str, Any]] = [
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
    together, admitted = decided(ledger, wanted)
    # the fourth high pod is over "pods" (3 and the warm one gone): it ends the prefix
    assert together == [1, 2, 3, 4]
    assert admitted == [1, 2, 3, 4, 6]


# -- group commit ------------------------------------------------------------------------------
def test_a_batch_hands_its_tracked_reserves_to_one_set_call(
    postgres_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    real = PgCursor.pipelined

    def spy(fast: PgCursor, calls: Sequence[Call]) -> list[list[Any]]:
        sizes.extend(len(c.params["ids"]) for c in calls if "quota_ledger_reserve_many(" in c.sql)
        return real(fast, calls)

    monkeypatch.setattr(PgCursor, "pipelined", spy)
    engine = QuotaEngine.from_url(postgres_url, batching=True, pool_size=4)
    try:
        engine.apply_config(CONFIG)
        engine.rollback(engine.reserve("root.org.lab", {"fpga": 1, "memory": 1}, partition="set").id)
        sizes.clear()
        # eight users start applications; root.org runs 6 at most
        made = engine.decide_all(
            [
                engine.prepare_reserve(
                    "root.org.lab",
                    {"fpga": 1},
                    partition="set",
                    user=f"user-{n}",
                    groups=["ops"],
                    application=f"app-{n}",
                )
                for n in range(8)
            ]
        )
        assert [type(o) for o in made] == [*[Reservation] * 6, OverQuota, OverQuota]
        assert sizes == [8]  # one set call for all eight, then the two it declined by their own calls
        assert engine.usage("root.org", partition="set")["applications"].in_use == 6
        assert engine.audit() == []
    finally:
        engine.close()


def test_a_copy_made_after_a_change_to_what_it_counts_is_set_aside(ledger: QuotaEngine) -> None:
    # pat's first request changes pat's application rows below root.org but (as these
    # arguments say) is charged to none of pat's counters; pat's second needs pat's copy at
    # root.org, which one after another would count the first: it is set aside
    first = build(ledger, "set", tracked("root.org.lab", {"fpga": 1}, user="pat", application="pat-1"))
    for field in ("kinds", "names", "queues", "resources", "amounts", "limits"):
        first[f"id_{field}"] = []
    second = build(ledger, "set", tracked("root.org.lab", {"fpga": 1}, user="pat", application="pat-2"))
    third = build(ledger, "set", tracked("root.org.lab", {"fpga": 1}, user="quin", application="quin-1"))
    made = pg_functions.reserve_many([first, second, third])
    answer = ledger.driver.call(made.sql, made.params)
    assert answer is not None
    assert [row.idx for row in answer] == [1, 3]
