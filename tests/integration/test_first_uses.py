"""First uses, on every decision path: a new queue, a new application, a new user under a
wildcard user limit and a new group under a wildcard group limit.

A first use creates what it needs in the reservation's own transaction (a queue's counters, an
application row that then counts against every ``maxapplications`` on its way to root, a user's
copies of a wildcard limit, the shared group bucket's counters), refuses what breaks a limit
leaving no trace, and many threads making the same first use at once neither break a limit nor
duplicate a row nor see a deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from ledger_dump import dump
from partition_rows import apps_of, counters_of, identities_of, partition_rows
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import URL

from quota_ledger import OverQuota, QuotaEngine, ReservationState
from quota_ledger.driver.dialect import normalize_url
from quota_ledger.driver.schema import quota_applications, quota_identity_usages, quota_usages
from quota_ledger.model.values import Reservation

GI = 1 << 30
#: threads making the same first use at once
THREADS = 8
PARTITION = """
- name: {name}
  queues:
  - name: root
    queues:
    - name: org
      maxapplications: 10
      resources: {{max: {{fpga: 40, memory: 40Gi}}}}
      limits:
      - users: ["*"]
        maxresources: {{fpga: 6, memory: 8Gi}}
        maxapplications: 2
      - groups: [dev]
        maxresources: {{fpga: 10}}
      - groups: ["*"]
        maxresources: {{fpga: 12, memory: 6Gi}}
        maxapplications: 3
      queues:
      - name: team
        maxapplications: 4
        resources: {{max: {{fpga: 20}}}}
        limits:
        - users: ["*"]
          maxresources: {{fpga: 5}}
          maxapplications: 2
"""
KINDS = ("queue", "application", "user", "group")


def configured(engine: QuotaEngine, *partitions: str) -> QuotaEngine:
    engine.apply_config("partitions:" + "".join(PARTITION.format(name=p) for p in partitions))
    return engine


def test_first_uses_make_what_they_need(path_ledger: QuotaEngine, path_url: URL) -> None:
    engine = configured(path_ledger, "default")
    # a new queue, twice
    engine.commit(engine.reserve("root.org.new", {"fpga": 1, "memory": GI}).id)
    # a new user under the wildcards (a bucket: no application), in a new queue too, and a new
    # application of that user (maxapplications on root.org, root.org.team and ann's), decided
    # together
    made = engine.decide_all(
        [
            engine.prepare_reserve("root.org.new", {"fpga": 1}),
            engine.prepare_reserve("root.org.team.x", {"fpga": 1}, user="ann", groups=["dev"]),
            engine.prepare_reserve(
                "root.org.team", {"fpga": 2}, user="ann", groups=["dev"], application="a1"
            ),
            # a new user whose group is tracked against the shared wildcard group
            engine.prepare_reserve("root.org", {"memory": GI}, user="bob", groups=["ops"], application="b1"),
            # a new application that starts without a commit, rolled back below
            engine.prepare_reserve("root.org", {"fpga": 1}, user="cat", groups=["x"], application="c1"),
        ]
    )
    assert all(isinstance(r, Reservation) for r in made)
    reservations = [r for r in made if isinstance(r, Reservation)]
    done = engine.decide_all(
        [engine.prepare_commit(r.id) for r in reservations[:4]]
        + [engine.prepare_rollback(reservations[4].id)]
    )
    assert [r.state for r in done if isinstance(r, Reservation)] == [ReservationState.COMMITTED] * 4 + [
        ReservationState.ROLLED_BACK
    ]
    # another reservation of a running application, rolled back: it keeps running
    engine.rollback(
        engine.reserve("root.org.team", {"fpga": 1}, user="ann", groups=["dev"], application="a1").id
    )
    found = partition_rows(path_url, "default")
    counters = counters_of(found)
    assert counters[("queue", "root.org.new", "fpga")] == (2, 0, None)
    assert counters[("queue", "root.org.new", "memory")] == (GI, 0, None)
    assert counters[("queue", "root.org.team.x", "fpga")] == (1, 0, None)
    assert counters[("subtree", "root.org", "fpga")] == (5, 0, 40)
    assert counters[("subtree", "root.org", "applications")] == (2, 0, 10)  # a1, b1: c1 stopped
    assert counters[("subtree", "root.org.team", "applications")] == (1, 0, 4)
    assert identities_of(found) == {
        # ann's copies of the wildcard limits on root.org and root.org.team: her bucket and a1
        ("user", "ann", "root.org", "applications"): (1, 0, 2),
        ("user", "ann", "root.org", "fpga"): (3, 0, 6),
        ("user", "ann", "root.org.team", "applications"): (1, 0, 2),
        ("user", "ann", "root.org.team", "fpga"): (3, 0, 5),
        ("group", "dev", "root.org", "fpga"): (3, 0, 10),
        # bob's and cat's groups have no limit of their own: the shared bucket counts them
        ("user", "bob", "root.org", "applications"): (1, 0, 2),
        ("user", "bob", "root.org", "memory"): (GI, 0, 8 * GI),
        ("group", "*", "root.org", "applications"): (1, 0, 3),
        ("group", "*", "root.org", "fpga"): (0, 0, 12),
        ("group", "*", "root.org", "memory"): (GI, 0, 6 * GI),
        # cat's application stopped again when its only reservation was rolled back
        ("user", "cat", "root.org", "applications"): (0, 0, 2),
        ("user", "cat", "root.org", "fpga"): (0, 0, 6),
    }
    apps = {key: (*row[:7], *row[8:]) for key, row in apps_of(found).items()}  # areas are the clock's
    assert apps == {
        "\tann\troot.org.team.x": (
            None,
            "ann",
            "root.org.team.x",
            "dev",
            "running",
            0,
            {"fpga": [1, 0]},
            True,
            False,
        ),
        "a1": ("a1", "ann", "root.org.team", "dev", "running", 0, {"fpga": [2, 0]}, True, False),
        "b1": ("b1", "bob", "root.org", "*", "running", 0, {"memory": [GI, 0]}, True, False),
        "c1": ("c1", "cat", "root.org", "*", "finished", 0, {}, False, True),
    }
    assert engine.audit() == []


def fill(engine: QuotaEngine) -> None:
    """ann runs two applications (her maximum), the shared group bucket three (its maximum)."""
    for n in range(2):
        engine.commit(
            engine.reserve("root.org", {"fpga": 1}, user="ann", groups=["dev"], application=f"a{n}").id
        )
    for user in ("gus", "hal", "ivy"):
        engine.commit(
            engine.reserve("root.org", {"memory": 1}, user=user, groups=["y"], application=f"{user}-1").id
        )


REFUSED: list[tuple[str, dict[str, int], dict[str, Any]]] = [
    ("root.org.big", {"fpga": 41}, {}),  # a new queue over the limit of its parent
    ("root.org.team", {"fpga": 6}, {"user": "dan", "groups": ["dev"]}),  # a new user over the copy
    # a new application over the user's maxapplications (ann runs two already)
    ("root.org", {"fpga": 1}, {"user": "ann", "groups": ["dev"], "application": "a3"}),
    # a new application over the shared group's maxapplications (three run in it)
    ("root.org", {"memory": 1}, {"user": "eve", "groups": ["z"], "application": "e1"}),
]


def test_refused_first_uses_leave_nothing(path_ledger: QuotaEngine) -> None:
    engine = configured(path_ledger, "default")
    fill(engine)
    before = dump(engine)
    for queue, resources, options in REFUSED:
        with pytest.raises(OverQuota):
            engine.reserve(queue, resources, **options)
    assert dump(engine) == before
    together = engine.decide_all([engine.prepare_reserve(q, r, **options) for q, r, options in REFUSED])
    assert [type(o) for o in together] == [OverQuota] * len(REFUSED)
    assert dump(engine) == before
    assert engine.audit() == []


def race(threads: int, work: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run(n: int) -> None:
        try:
            start.wait()
            work(n)
        except OverQuota:
            pass
        except BaseException as error:  # reported below
            errors.append(error)

    crew = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for t in crew:
        t.start()
    for t in crew:
        t.join(timeout=120)
    return errors


def duplicates(url: URL) -> list[tuple[Any, ...]]:
    """Rows that exist twice: a counter, a user's or group's counter, an application."""
    u, d, a = quota_usages.c, quota_identity_usages.c, quota_applications.c
    keys = (
        (u.partition, u.scope_type, u.scope, u.resource),
        (d.partition, d.kind, d.name, d.queue, d.resource),
        (a.partition, a.app_key),
    )
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return [
                tuple(row)
                for key in keys
                for row in conn.execute(select(*key, func.count()).group_by(*key).having(func.count() > 1))
            ]
    finally:
        engine.dispose()


#: what the threads of each kind ask, each thread once: (queue, resources, options)
REQUESTS: dict[str, Callable[[int], tuple[str, dict[str, Any], dict[str, Any]]]] = {
    # 8 x 6 fpga on one new queue under root.org's 40
    "queue": lambda n: ("root.org.fresh", {"fpga": 6}, {}),
    # one new application of one new user: 8 x 1 fpga under ann's 5 at root.org.team
    "application": lambda n: (
        "root.org.team",
        {"fpga": 1},
        {"user": "ann", "groups": ["dev"], "application": "a1"},
    ),
    # one new user, each thread its own new application: ann's maxapplications is 2
    "user": lambda n: ("root.org", {"fpga": 1}, {"user": "ann", "groups": ["dev"], "application": f"a{n}"}),
    # new users of new groups tracked against the shared wildcard group: 3 applications
    "group": lambda n: (
        "root.org",
        {"memory": GI},
        {"user": f"u{n}", "groups": [f"new{n}"], "application": f"g{n}"},
    ),
}


def test_concurrent_first_uses_of_one_thing_stay_within_limits(
    path_ledger: QuotaEngine, path_url: URL
) -> None:
    engine = configured(path_ledger, *KINDS)
    for kind in KINDS:

        def work(n: int, kind: str = kind) -> None:
            queue, resources, options = REQUESTS[kind](n)
            engine.commit(engine.reserve(queue, resources, partition=kind, **options).id)

        assert race(THREADS, work) == [], kind
    assert duplicates(path_url) == []
    by_partition = {
        kind: sum(1 for row in partition_rows(path_url, kind)["reservations"] if row[1] == "committed")
        for kind in KINDS
    }
    assert by_partition == {"queue": 6, "application": 5, "user": 2, "group": 3}
    assert engine.audit() == []
