"""What a plain caller's story and a tracked caller's story leave in the tables, row by row, on
every decision path.

On PostgreSQL a plain or tracked reserve, commit and expiry is decided by a server function
where it can be, and with batching the requests decided together go to the set functions; the
rest is decided by the general path; on MariaDB and SQLite with batching, by sets. Whichever
decides, the rows must be these: every counter, reservation (with its items and ttl), journal
entry, user and group counter and application row, and the summary a finished application
leaves.
"""

from __future__ import annotations

from typing import Any

import pytest
from partition_rows import partition_rows
from sql_rows import rows
from sqlalchemy.engine import URL

from quota_ledger import OverQuota, QuotaEngine, ReservationState
from quota_ledger.model.values import Reservation

GI = 1 << 30


def test_a_plain_story_leaves_its_rows(path_ledger: QuotaEngine, path_url: URL) -> None:
    engine = path_ledger
    engine.set_limits("root.x", {"fpga": 10, "vcore": "8"})
    engine.set_limits("root.x.y", {"fpga": 6})
    kept, rolled, high = engine.decide_all(
        [
            engine.prepare_reserve("root.x.y", {"fpga": 2, "vcore": "500m"}, key="k1", ttl=300),
            engine.prepare_reserve("root.x.y", {"fpga": 1}, ttl=120),
            engine.prepare_reserve("root.x", {"vcore": "1"}, priority_class="high", ttl=60),
        ]
    )
    assert isinstance(kept, Reservation)
    assert isinstance(rolled, Reservation)
    assert isinstance(high, Reservation)
    once, twice, back = engine.decide_all(
        [engine.prepare_commit(kept.id), engine.prepare_commit(kept.id), engine.prepare_rollback(rolled.id)]
    )
    assert isinstance(once, Reservation)
    assert once == twice  # committing twice returns the committed one
    assert isinstance(back, Reservation)
    assert (once.state, back.state) == (ReservationState.COMMITTED, ReservationState.ROLLED_BACK)
    with pytest.raises(OverQuota):
        engine.reserve("root.x.y", {"fpga": 5})
    engine.release("root.x.y", {"fpga": 1})
    found = partition_rows(path_url, "default")
    assert found["reservations"] == [
        # key, state, queue, user, groups, application, priority class, kube, resolved, released, ttl
        (
            "k1",
            "committed",
            "root.x.y",
            None,
            None,
            None,
            None,
            kube(False, None, fpga=2, vcore=500),
            True,
            False,
            300,
        ),
        (
            None,
            "pending",
            "root.x",
            None,
            None,
            None,
            "high",
            kube(False, "high", vcore=1000),
            False,
            False,
            60,
        ),
        (None, "rolled_back", "root.x.y", None, None, None, None, kube(True, None, fpga=1), True, False, 120),
    ]
    assert found["items"] == [
        ("k1", "root.x.y", "committed", "fpga", 2, 2),
        ("k1", "root.x.y", "committed", "vcore", 500, 500),
        (None, "root.x", "pending", "vcore", 1000, None),
        (None, "root.x.y", "rolled_back", "fpga", 1, None),
    ]
    assert found["journal"] == [
        ("root.x.y", "fpga", -1, "release", None, None),
        ("root.x.y", "fpga", 2, "commit", "k1", "root.x.y"),
        ("root.x.y", "vcore", 500, "commit", "k1", "root.x.y"),
    ]
    assert found["counters"] == [
        ("queue", "root.x", "vcore", 0, 1000, None),
        ("queue", "root.x.y", "fpga", 1, 0, None),
        ("queue", "root.x.y", "vcore", 500, 0, None),
        ("subtree", "root.x", "fpga", 1, 0, 10),
        ("subtree", "root.x", "vcore", 500, 1000, 8000),
        ("subtree", "root.x.y", "fpga", 1, 0, 6),
    ]
    assert found["identities"] == found["apps"] == []
    assert engine.audit() == []


def kube(
    best_effort: bool, priority: str | None, *, fpga: int = 0, vcore: int = 0, memory: int = 0
) -> dict[str, Any]:
    """What a reservation records for the ResourceQuotas of its namespace: its scopes and usage."""
    usage: dict[str, int] = {"count/pods": 1, "pods": 1}
    if fpga:
        usage["requests.fpga"] = fpga
    if vcore:
        usage.update({"cpu": vcore, "limits.cpu": vcore, "requests.cpu": vcore})
    if memory:
        usage.update({"memory": memory, "limits.memory": memory, "requests.memory": memory})
    scopes = {
        "bestEffort": best_effort,
        "crossNamespacePodAffinity": False,
        "priorityClass": priority,
        "terminating": False,
    }
    return {"scopes": scopes, "usage": usage}


TRACKED_CONFIG = """
partitions:
- name: default
  queues:
  - name: root
    queues:
    - name: org
      limits:
      - users: ["*"]
        maxresources: {fpga: 8, memory: 8Gi}
        maxapplications: 3
      - groups: [dev]
        maxresources: {fpga: 10}
      - groups: ["*"]
        maxresources: {memory: 6Gi}
      queues:
      - name: team
        resources: {max: {fpga: 20}}
        limits:
        - users: [ann]
          maxresources: {fpga: 3}
          maxapplications: 2
"""


def test_a_tracked_story_leaves_its_rows(path_ledger: QuotaEngine, path_url: URL) -> None:
    """Applications of two users in two groups: new, running, refused, rolled back, released."""
    engine = path_ledger
    engine.apply_config(TRACKED_CONFIG)
    for n in range(3):
        made = engine.decide_all(
            [
                engine.prepare_reserve(
                    "root.org.team",
                    {"fpga": 1, "memory": "1Gi"},
                    user=user,
                    groups=groups,
                    application=f"{user}-app",
                    ttl=300,
                )
                for user, groups in (("ann", ["dev"]), ("bob", ["ops", "qa"]))
            ]
        )
        reservations = [r for r in made if isinstance(r, Reservation)]
        assert len(reservations) == 2
        engine.decide_all(
            [engine.prepare_rollback(r.id) if n == 1 else engine.prepare_commit(r.id) for r in reservations]
        )
    bucket = engine.reserve("root.org.team", {"fpga": 1}, user="bob", groups=["qa"])
    engine.commit(bucket.id)
    with pytest.raises(OverQuota):  # ann's own limit at root.org.team
        engine.reserve("root.org.team", {"fpga": 2}, user="ann", application="ann-app")
    engine.release("root.org.team", {"fpga": 1}, user="ann", application="ann-app", finished=True)
    found = partition_rows(path_url, "default")
    app = kube(False, None, fpga=1, memory=GI)
    ann = ("root.org.team", "ann", ["dev"], "ann-app", None, app, True, False, 300)
    bob = ("root.org.team", "bob", ["ops", "qa"], "bob-app", None, app, True, False, 300)
    assert found["reservations"] == [
        (None, "committed", *ann),
        (None, "committed", *ann),
        (None, "committed", *bob),
        (None, "committed", *bob),
        (
            None,
            "committed",
            "root.org.team",
            "bob",
            ["qa"],
            None,
            None,
            kube(True, None, fpga=1),
            True,
            False,
            300,
        ),
        (None, "rolled_back", *ann),
        (None, "rolled_back", *bob),
    ]
    assert sorted(row[2:] for row in found["items"]) == sorted(
        [("committed", "fpga", 1, 1)] * 5
        + [("committed", "memory", GI, GI)] * 4
        + [("rolled_back", "fpga", 1, None)] * 2
        + [("rolled_back", "memory", GI, None)] * 2
    )
    assert found["journal"] == [
        ("root.org.team", "fpga", -1, "release", None, None),
        *[("root.org.team", "fpga", 1, "commit", None, "root.org.team")] * 5,
        *[("root.org.team", "memory", GI, "commit", None, "root.org.team")] * 4,
    ]
    assert found["counters"] == [
        ("queue", "root.org.team", "fpga", 4, 0, None),
        ("queue", "root.org.team", "memory", 4 * GI, 0, None),
        ("subtree", "root.org.team", "fpga", 4, 0, 20),
    ]
    assert found["identities"] == [
        # bob's groups have no limit of their own: the shared bucket counts his memory
        ("group", "*", "root.org", "memory", 2 * GI, 0, 6 * GI),
        ("group", "dev", "root.org", "fpga", 1, 0, 10),
        # ann's application finished: it no longer counts against her maxapplications
        ("user", "ann", "root.org", "applications", 0, 0, 3),
        ("user", "ann", "root.org", "fpga", 1, 0, 8),
        ("user", "ann", "root.org", "memory", 2 * GI, 0, 8 * GI),
        ("user", "ann", "root.org.team", "applications", 0, 0, 2),
        ("user", "ann", "root.org.team", "fpga", 1, 0, 3),
        ("user", "bob", "root.org", "applications", 1, 0, 3),
        ("user", "bob", "root.org", "fpga", 3, 0, 8),
        ("user", "bob", "root.org", "memory", 2 * GI, 0, 8 * GI),
    ]
    # app key, application, user, queue, group, state, pending, usage, started, finished (the
    # areas are the clock's)
    assert [(*row[:8], *row[9:]) for row in found["apps"]] == [
        (
            "\tbob\troot.org.team",
            None,
            "bob",
            "root.org.team",
            "*",
            "running",
            0,
            {"fpga": [1, 0]},
            True,
            False,
        ),
        (
            "ann-app",
            "ann-app",
            "ann",
            "root.org.team",
            "dev",
            "finished",
            0,
            {"fpga": [1, 0], "memory": [2 * GI, 0]},
            True,
            True,
        ),
        (
            "bob-app",
            "bob-app",
            "bob",
            "root.org.team",
            "*",
            "running",
            0,
            {"fpga": [2, 0], "memory": [2 * GI, 0]},
            True,
            False,
        ),
    ]
    assert rows(path_url, "SELECT application FROM quota_app_summaries") == [("ann-app",)]
    assert engine.audit() == []
