"""Group commit on MariaDB and SQLite decides tracked reserves and first uses as a set
(:mod:`quota_ledger.ledger.reserve_set`, :mod:`.reserve_set_tracking`): new queues, new and
running applications, a user's copies of a wildcard limit, a new group's.

Every test reserves the same requests in two partitions of one configuration: in ``set`` as one
batch, and in ``one`` one after another without batching, in the batch's order (a batch runs
the requests of one queue together). Both must admit the same requests and leave the same rows
(application rows, queue and user/group counters, reservations and items), the audit must stay
clean, and the set must send far fewer statements than the steps would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from sql_rows import Statements, rows
from sqlalchemy.engine import URL

from quota_ledger import InvalidRequest, OverQuota, QuotaEngine, Reservation

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
"""
CONFIG = "partitions:" + "".join(PARTITION.format(name=name) for name in ("set", "one"))
BOTH = ("set", "one")
GI = 1 << 30


@pytest.fixture(autouse=True)
def no_batch_fails(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No set or batch failed and was decided again one request at a time."""
    yield
    assert not [r.getMessage() for r in caplog.get_records("call") if r.name == "quota_ledger.group_commit"]


@pytest.fixture
def engines(core_db_url: URL) -> Iterator[tuple[QuotaEngine, QuotaEngine]]:
    """An engine that batches and one that does not, on one database configured with twin
    partitions whose queues root.org.team and root.org.lab name fpga and memory."""
    batched = QuotaEngine.from_url(core_db_url, batching=True, pool_size=4)
    unbatched = QuotaEngine.from_url(core_db_url)
    unbatched.apply_config(CONFIG)
    for partition in BOTH:
        for queue in ("root.org.team", "root.org.lab"):
            unbatched.rollback(unbatched.reserve(queue, {"fpga": 1, "memory": 1}, partition=partition).id)
    yield batched, unbatched
    batched.close()
    unbatched.close()


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


def snapshot(url: URL, partition: str) -> dict[str, list[tuple[Any, ...]]]:
    """What a reserve writes, without ids, clock readings and request hashes."""
    queries = {
        "apps": 'SELECT app_key, application, user_name, queue, group_name, state, pending, "usage", area'
        ' FROM quota_applications WHERE "partition" = :p ORDER BY app_key',
        "counters": "SELECT scope_type, scope, resource, in_use, reserved, hard_limit FROM quota_usages"
        ' WHERE "partition" = :p ORDER BY 1, 2, 3',
        "identity": "SELECT kind, name, queue, resource, in_use, reserved, hard_limit"
        ' FROM quota_identity_usages WHERE "partition" = :p ORDER BY 1, 2, 3, 4',
        "reservations": 'SELECT r.state, r.queue, r.user_name, r."groups", r.application, r.priority_class,'
        " r.kube, i.resource, i.amount FROM reservations r JOIN reservation_items i"
        ' ON i.reservation_id = r.id WHERE r."partition" = :p ORDER BY 1, 2, 3, 4, 5, 6, 7, 8, 9',
    }
    if url.get_backend_name() != "sqlite":
        queries = {name: sql.replace('"', "`") for name, sql in queries.items()}
    found = {name: rows(url, sql, {"p": partition}) for name, sql in queries.items()}
    # usage and area are JSON: compare them parsed
    found["apps"] = [(*row[:7], json.loads(row[7]), sorted(json.loads(row[8]))) for row in found["apps"]]
    return found


def same_rows(
    engines: tuple[QuotaEngine, QuotaEngine], url: URL, wanted: list[dict[str, Any]]
) -> tuple[list[type], int, int]:
    """Reserve ``wanted`` both ways; check both admitted the same (in the batch's order) and
    left the same rows; the outcomes' types in the batch's order, and the statements the batch
    and the requests one at a time sent."""
    batched, unbatched = engines
    ordered = sorted(wanted, key=lambda w: str(w["queue"]))  # a batch's order: one queue together
    sent = Statements(batched)
    together = batched.decide_all([batched.prepare_reserve(partition="set", **w) for w in ordered])
    together_sent = sent.count
    alone_sent = Statements(unbatched)
    alone: list[Reservation | Exception] = []
    for w in ordered:
        try:
            alone.append(unbatched.reserve(partition="one", **w))
        except (OverQuota, InvalidRequest) as error:
            alone.append(error)
    kinds = [type(o) for o in together]
    alone_count = alone_sent.count
    assert kinds == [type(o) for o in alone]
    assert snapshot(url, "set") == snapshot(url, "one")
    assert batched.audit() == []
    return kinds, together_sent, alone_count


def test_first_uses_of_queues_applications_users_and_groups_leave_the_rows_of_one_at_a_time(
    engines: tuple[QuotaEngine, QuotaEngine], core_db_url: URL
) -> None:
    _, unbatched = engines
    for partition in BOTH:  # a running application of ann's with a commit, and one of bob's
        kept = unbatched.reserve(
            "root.org.team", {"fpga": 1}, partition=partition, user="ann", groups=["dev"], application="ann-1"
        )
        unbatched.commit(kept.id)
        unbatched.reserve(
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
    kinds, together, alone = same_rows(engines, core_db_url, wanted)
    assert kinds == [Reservation] * len(wanted)
    assert together * 4 < alone
    after = snapshot(core_db_url, "set")
    apps = {row[0]: row for row in after["apps"]}
    assert apps["bob-2"][5:8] == ("running", 2, {"fpga": [0, 3], "memory": [0, 2 * GI]})
    assert apps["bob-1"][6:8] == (2, {"memory": [0, 3 * GI]})
    assert apps["eli-1"][2:5] == ("eli", "root.org.lab.new", "*")
    identity = {row[:4]: row[4:] for row in after["identity"]}
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


def test_a_refused_first_use_in_the_middle_leaves_nothing_and_the_rest_take_their_steps(
    engines: tuple[QuotaEngine, QuotaEngine], core_db_url: URL
) -> None:
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
    kinds, _, _ = same_rows(engines, core_db_url, wanted)
    assert kinds == [Reservation, Reservation, OverQuota, Reservation, Reservation]
    after = snapshot(core_db_url, "set")
    assert [row[0] for row in after["apps"]] == ["amy-1", "fay-1", "gus-1"]
    assert not [row for row in after["identity"] if row[1] == "new"]
    assert not [row for row in after["counters"] if row[1] == "root.org.lab.fresh"]
    identity = {row[:4]: row[4:] for row in after["identity"]}
    assert identity[("user", "fay", "root.org", "fpga")] == (0, 5, 8)
    assert identity[("group", "dev", "root.org", "fpga")] == (0, 2 + 5 + 1 + 1, 10)
    # the first one refused (a new user over the copy made for it): every one takes its step
    wanted = [
        tracked("root.org.lab", {"fpga": 9}, user="kay", groups=["new"], application="kay-1"),
        tracked("root.org.lab", {"fpga": 1}, user="kay", groups=["new"], application="kay-1"),
        tracked("root.org.lab", {"fpga": 1}, user="lou", application="lou-1"),
    ]
    kinds, _, _ = same_rows(engines, core_db_url, wanted)
    assert kinds == [OverQuota, Reservation, Reservation]
    # plain first uses: the refused one's new queue leaves no counter
    wanted = [
        tracked("root.org.team", {"fpga": 1}),
        tracked("root.org.team.big", {"fpga": 21}),  # over root.org.team's 20
        tracked("root.org.team.zz", {"fpga": 1}),
    ]
    kinds, _, _ = same_rows(engines, core_db_url, wanted)
    assert kinds == [Reservation, OverQuota, Reservation]
    assert not [row for row in snapshot(core_db_url, "set")["counters"] if row[1] == "root.org.team.big"]


def test_several_requests_of_one_new_application_start_it_once(
    engines: tuple[QuotaEngine, QuotaEngine], core_db_url: URL
) -> None:
    wanted = [
        tracked("root.org.lab", {"fpga": 1, "memory": GI}, user="hoy", groups=["dev"], application="hoy-1")
    ]
    wanted *= 4
    wanted.append(tracked("root.org.lab", {"fpga": 1}, user="hoy", groups=["dev"], application="hoy-2"))
    wanted.append(tracked("root.org.lab", {"memory": GI}, user="hoy", groups=["dev"]))  # hoy's bucket
    kinds, together, alone = same_rows(engines, core_db_url, wanted)
    assert kinds == [Reservation] * 6
    assert together * 3 < alone
    after = snapshot(core_db_url, "set")
    apps = {row[0]: row for row in after["apps"]}
    assert apps["hoy-1"][5:8] == ("running", 4, {"fpga": [0, 4], "memory": [0, 4 * GI]})
    identity = {row[:4]: row[4:] for row in after["identity"]}
    assert identity[("user", "hoy", "root.org", "applications")] == (2, 0, 3)
    assert identity[("user", "hoy", "root.org", "memory")] == (0, 5 * GI, 8 * GI)
    assert ("subtree", "root.org", "applications", 2, 0, 6) in after["counters"]


def test_maxapplications_admits_exactly_so_many_new_applications(
    engines: tuple[QuotaEngine, QuotaEngine], core_db_url: URL
) -> None:
    _, unbatched = engines
    for partition in BOTH:  # one of eve's three applications runs already
        unbatched.reserve("root.org.lab", {"fpga": 1}, partition=partition, user="eve", application="eve-0")
    # eve-3 is her fourth: over her limit of 3, it ends the prefix; eve-1 again fits, by its step
    wanted = [tracked("root.org.lab", {"fpga": 1}, user="eve", application=f"eve-{n}") for n in (1, 2, 3, 1)]
    kinds, _, _ = same_rows(engines, core_db_url, wanted)
    assert kinds == [Reservation, Reservation, OverQuota, Reservation]
    # root.org's maxapplications of 6 (eve's 3 run): four more users, four new applications
    wanted = [tracked("root.org.lab", {"fpga": 1}, user=f"u{n}", application=f"u{n}-app") for n in range(4)]
    kinds, _, _ = same_rows(engines, core_db_url, wanted)
    assert kinds == [Reservation, Reservation, Reservation, OverQuota]
    assert ("subtree", "root.org", "applications", 6, 0, 6) in snapshot(core_db_url, "set")["counters"]


def test_a_finished_or_foreign_application_and_a_new_resource_are_left_to_their_steps(
    engines: tuple[QuotaEngine, QuotaEngine], core_db_url: URL
) -> None:
    _, unbatched = engines
    for partition in BOTH:
        held = unbatched.reserve(
            "root.org.lab", {"fpga": 1}, partition=partition, user="hal", application="hal-1"
        )
        unbatched.commit(held.id)
        unbatched.release(
            "root.org.lab", {"fpga": 1}, partition=partition, user="hal", application="hal-1", finished=True
        )
    wanted = [
        tracked("root.org.lab", {"fpga": 1}, user="ivy", application="ivy-1"),
        tracked("root.org.lab", {"fpga": 1}, user="hal", application="hal-1"),  # finished: a new run
        tracked("root.org.lab", {"fpga": 1}, user="ivy", application="ivy-1"),
        tracked("root.org.lab", {"fpga": 1, "vcore": 1}, user="jon", application="jon-1"),  # vcore is new
        tracked("root.org.lab", {"fpga": 1}, user="jon", application="jon-1"),  # after its first: a step
        tracked(
            "root.org.lab", {"fpga": 1}, user="kit", application="hal-1"
        ),  # hal-1 runs again (a step): not kit's
    ]
    kinds, _, _ = same_rows(engines, core_db_url, wanted)
    assert kinds == [Reservation] * 5 + [InvalidRequest]
    apps = {row[0]: row for row in snapshot(core_db_url, "set")["apps"]}
    assert apps["jon-1"][6:8] == (2, {"fpga": [0, 2], "vcore": [0, 1000]})


def test_threads_starting_applications_get_exactly_what_fits(core_db_url: URL) -> None:
    # Two batching engines, so that sets of both race for the same new rows and counters.
    first = QuotaEngine.from_url(core_db_url, batching=True, pool_size=4)
    second = QuotaEngine.from_url(core_db_url, batching=True, pool_size=4)
    first.apply_config(CONFIG)
    first.rollback(first.reserve("root.org.lab", {"fpga": 1}, partition="set").id)
    made: list[Reservation] = []
    refused: list[OverQuota] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        engine = first if n % 2 else second
        for i in range(5):
            # users share two names: each may start 3 applications (the wildcard's copy,
            # made by whichever set or step comes first), root.org 6 in all
            user = f"w{n % 2}"
            try:
                reservation = engine.reserve(
                    f"root.org.lab.q{i % 3}",
                    {"fpga": 1},
                    partition="set",
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
    try:
        assert len(made) == 6
        assert len(refused) == 30 - 6
        assert {r.user for r in made} == {"w0", "w1"}
        assert sum(r.user == "w0" for r in made) == 3
        usage = first.usage("root.org", partition="set")
        assert usage["applications"].in_use == 6
        assert first.audit() == []
        assert first.batch_stats.largest > 1 or second.batch_stats.largest > 1
    finally:
        first.close()
        second.close()
