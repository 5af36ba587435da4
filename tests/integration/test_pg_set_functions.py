"""The PostgreSQL set functions of revision 0012, called directly: ``quota_ledger_reserve_many``
(a batch's plain reserves of one partition) and ``quota_ledger_commit_many`` (its whole commits).

Each test builds the call as group commit does (:func:`pg_functions.reserve_many`,
:func:`pg_functions.commit_many`), runs it, and checks both the rows it returns and what it left
in the database: what it admitted or committed is written whole, each counter charged once with
the sum; what it declined leaves no trace (the caller decides it alone); the audit stays clean.

Path-specific: these are the functions' own contracts (which requests a call admits, which it
declines and why, guarded and unguarded calls). What a batch decides through them is tested on
every decision path (``test_batches_decide_as_alone.py``, ``test_tracked_batches.py``), and
``test_differential.py`` holds them to the Python rule on random inputs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pytest
from sql_rows import execute, rows
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine, ReservationState
from quota_ledger.driver import pg_functions
from quota_ledger.driver.pg_cursor import Call
from quota_ledger.ledger import commit_function, reserve_function
from quota_ledger.model import requests

GI = 1 << 30
K = TypeVar("K")


@pytest.fixture
def ledger(postgres_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(postgres_url)
    engine.set_limits("root", {"fpga": 100})
    engine.set_limits("root.a", {"fpga": 5, "memory": "4Gi"})
    engine.set_limits("root.p", {"fpga": 5})
    engine.set_limits("root.p.x", {"fpga": 4})
    for queue, resources in (
        ("root.a", {"fpga": 1, "memory": 1}),
        ("root.p.x", {"fpga": 1}),
        ("root.p.y", {"fpga": 1}),
    ):
        engine.rollback(engine.reserve(queue, resources).id)  # creates the queue's counters
    yield engine
    engine.close()


def plain(
    engine: QuotaEngine,
    queue: str,
    resources: dict[str, int],
    *,
    key: str | None = None,
    partition: str = "default",
) -> dict[str, Any]:
    """The parameters of one plain request's own call, as a batch would collect them."""
    request = requests.build(
        partition=partition,
        queue=queue,
        resources=resources,
        user=None,
        groups=(),
        application=None,
        ttl=300,
        default_ttl=300.0,
        key=key,
        kube={"usage": {}, "scopes": {"priorityClass": None}},
        namespace=queue.rsplit(".", 1)[-1],
    )
    known = engine.driver.run(lambda tx: engine.rules.known(lambda step: step(tx)))
    charges = reserve_function.quota_charges(known, request)
    identity = reserve_function.identity_of(known, request)
    assert charges == []  # a plain one
    assert identity.app_key is None
    assert not identity.counters
    return pg_functions.reserve_params(request, known.version, charges, identity)


def reserve_many(calls: Sequence[Mapping[str, Any]]) -> Call:
    return pg_functions.reserve_many(list(calls))


def call(engine: QuotaEngine, made: Call) -> list[Any]:
    answer = engine.driver.call(made.sql, made.params)
    assert answer is not None, "a set function never declines the whole call"
    return answer


def counters(url: URL, partition: str = "default") -> dict[tuple[str, str, str], tuple[int, int]]:
    return {
        (kind, scope, resource): (in_use, reserved)
        for kind, scope, resource, in_use, reserved in rows(
            url,
            "SELECT scope_type, scope, resource, in_use, reserved FROM quota_usages WHERE partition = :p",
            {"p": partition},
        )
    }


def moved(before: dict[K, tuple[int, int]], after: dict[K, tuple[int, int]]) -> dict[K, tuple[int, int]]:
    """What changed on each counter: (in use, reserved) deltas, the unchanged left out."""
    assert before.keys() == after.keys()
    delta = {k: (after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in after}
    return {k: d for k, d in delta.items() if d != (0, 0)}


def stored(url: URL, ids: list[str]) -> dict[str, tuple[str, list[tuple[str, int, int | None]]]]:
    """Each of ``ids`` that has a reservation row: its state and items (resource, amount, committed)."""
    found: dict[str, tuple[str, list[tuple[str, int, int | None]]]] = {}
    for rid, state in rows(url, "SELECT id, state FROM reservations WHERE id = ANY(:ids)", {"ids": ids}):
        items = rows(
            url,
            "SELECT resource, amount, committed FROM reservation_items WHERE reservation_id = :id"
            " ORDER BY resource",
            {"id": rid},
        )
        found[rid] = (state, [(r, int(a), None if c is None else int(c)) for r, a, c in items])
    return found


def orphans(url: URL) -> int:
    ((n,),) = rows(
        url,
        "SELECT count(*) FROM reservation_items i WHERE NOT EXISTS"
        " (SELECT 1 FROM reservations r WHERE r.id = i.reservation_id)",
    )
    return int(n)


def journal(url: URL, ids: list[str]) -> list[tuple[str, str, int, str, str]]:
    return [
        (rid, resource, int(delta), kind, op)
        for rid, resource, delta, kind, op in rows(
            url,
            "SELECT reservation_id, resource, delta, kind, operation_id FROM quota_journal"
            " WHERE reservation_id = ANY(:ids) ORDER BY reservation_id, resource",
            {"ids": ids},
        )
    ]


# -- quota_ledger_reserve_many -----------------------------------------------------------------
def test_the_prefix_that_fits_is_admitted_and_the_rest_leave_nothing(
    ledger: QuotaEngine, postgres_url: URL
) -> None:
    calls = [plain(ledger, "root.a", {"fpga": n}) for n in (2, 2, 2, 1)]
    ids = [c["id"] for c in calls]
    before = counters(postgres_url)
    answer = call(ledger, reserve_many(calls))
    # 2 + 2 fit under root.a's 5; the third 2 goes over, and so does everything after it
    # (the 1 alone would fit, but one after another it comes after a refusal it must not overtake)
    assert [row.idx for row in answer] == [1, 2]
    assert len({row.created_at for row in answer}) == 1
    assert stored(postgres_url, ids) == {
        ids[0]: ("pending", [("fpga", 2, None)]),
        ids[1]: ("pending", [("fpga", 2, None)]),
    }
    assert orphans(postgres_url) == 0
    assert moved(before, counters(postgres_url)) == {
        ("queue", "root.a", "fpga"): (0, 4),
        ("subtree", "root.a", "fpga"): (0, 4),
        ("subtree", "root", "fpga"): (0, 4),
    }
    for n in (0, 1):
        made = ledger.get(ids[n])
        assert (made.state, made.queue, made.resources) == (ReservationState.PENDING, "root.a", {"fpga": 2})
        assert made.created_at.replace(tzinfo=None) == answer[n].created_at
    assert ledger.audit() == []


def test_a_limit_at_the_parent_is_shared_by_its_queues(ledger: QuotaEngine, postgres_url: URL) -> None:
    amounts = [("root.p.x", 2), ("root.p.y", 2), ("root.p.x", 1), ("root.p.y", 1), ("root.a", 1)]
    calls = [plain(ledger, queue, {"fpga": n}) for queue, n in amounts]
    ids = [c["id"] for c in calls]
    before = counters(postgres_url)
    answer = call(ledger, reserve_many(calls))
    # root.p (limit 5) holds 2 + 2 + 1; the fourth would make it 6
    assert [row.idx for row in answer] == [1, 2, 3]
    assert set(stored(postgres_url, ids)) == set(ids[:3])
    assert moved(before, counters(postgres_url)) == {
        ("queue", "root.p.x", "fpga"): (0, 3),
        ("queue", "root.p.y", "fpga"): (0, 2),
        ("subtree", "root.p.x", "fpga"): (0, 3),
        ("subtree", "root.p", "fpga"): (0, 5),
        ("subtree", "root", "fpga"): (0, 5),
    }
    assert ledger.audit() == []


def test_a_request_with_two_resources_is_charged_on_both(ledger: QuotaEngine, postgres_url: URL) -> None:
    calls = [
        plain(ledger, "root.a", {"fpga": 2, "memory": GI}),
        plain(ledger, "root.a", {"fpga": 1}),
        plain(ledger, "root.a", {"fpga": 1, "memory": 3 * GI + 1}),  # memory over 4Gi by one byte
    ]
    ids = [c["id"] for c in calls]
    before = counters(postgres_url)
    answer = call(ledger, reserve_many(calls))
    assert [row.idx for row in answer] == [1, 2]
    assert stored(postgres_url, ids) == {
        ids[0]: ("pending", [("fpga", 2, None), ("memory", GI, None)]),
        ids[1]: ("pending", [("fpga", 1, None)]),
    }
    assert moved(before, counters(postgres_url)) == {
        ("queue", "root.a", "fpga"): (0, 3),
        ("queue", "root.a", "memory"): (0, GI),
        ("subtree", "root.a", "fpga"): (0, 3),
        ("subtree", "root.a", "memory"): (0, GI),
        ("subtree", "root", "fpga"): (0, 3),
    }
    assert ledger.get(ids[0]).resources == {"fpga": 2, "memory": GI}
    assert ledger.audit() == []


def test_a_first_use_of_a_queue_gets_its_counters_in_the_call(ledger: QuotaEngine, postgres_url: URL) -> None:
    fresh = [plain(ledger, "root.a", {"fpga": 1}), plain(ledger, "root.p.z", {"fpga": 1, "memory": 2})]
    before = counters(postgres_url)
    answer = call(ledger, reserve_many(fresh))
    assert sorted(row.idx for row in answer) == [1, 2]
    assert set(stored(postgres_url, [c["id"] for c in fresh])) == {c["id"] for c in fresh}
    after = counters(postgres_url)
    assert after[("queue", "root.p.z", "fpga")] == (0, 1)
    assert after[("queue", "root.p.z", "memory")] == (0, 2)
    created = {k: v for k, v in after.items() if k not in before}
    assert moved(before, {k: v for k, v in after.items() if k in before}) == {
        ("queue", "root.a", "fpga"): (0, 1),
        ("subtree", "root.a", "fpga"): (0, 1),
        ("subtree", "root.p", "fpga"): (0, 1),
        ("subtree", "root", "fpga"): (0, 2),
    }  # no limit on memory above root.p.z: only its own counter counts it
    assert set(created) == {("queue", "root.p.z", "fpga"), ("queue", "root.p.z", "memory")}
    assert ledger.audit() == []


def test_a_refused_first_use_of_a_queue_leaves_no_counter(ledger: QuotaEngine, postgres_url: URL) -> None:
    # root.p allows 5: the first use of root.p.z (6) ends the prefix, and so does its counter
    calls = [plain(ledger, "root.p.x", {"fpga": 1}), plain(ledger, "root.p.z", {"fpga": 6})]
    before = counters(postgres_url)
    answer = call(ledger, reserve_many(calls))
    assert [row.idx for row in answer] == [1]
    after = counters(postgres_url)
    assert after.keys() == before.keys()  # root.p.z's counter made in the call is gone again
    assert moved(before, after) == {
        ("queue", "root.p.x", "fpga"): (0, 1),
        ("subtree", "root.p.x", "fpga"): (0, 1),
        ("subtree", "root.p", "fpga"): (0, 1),
        ("subtree", "root", "fpga"): (0, 1),
    }
    assert set(stored(postgres_url, [c["id"] for c in calls])) == {calls[0]["id"]}
    assert ledger.audit() == []


def test_a_resource_new_to_the_partition_is_set_aside_without_holding_back_the_rest(
    ledger: QuotaEngine, postgres_url: URL
) -> None:
    # One after another, the request naming vcore (which the caller then decides alone, checking
    # the partition's bound on resource names) may come last: the ones after it go on.
    calls = [
        plain(ledger, "root.p.x", {"fpga": 1}),
        plain(ledger, "root.a", {"fpga": 1, "vcore": 1}),
        plain(ledger, "root.p.y", {"fpga": 1}),
    ]
    before = counters(postgres_url)
    answer = call(ledger, reserve_many(calls))
    assert sorted(row.idx for row in answer) == [1, 3]
    assert set(stored(postgres_url, [c["id"] for c in calls])) == {calls[0]["id"], calls[2]["id"]}
    after = counters(postgres_url)
    assert after.keys() == before.keys()  # no vcore counter made
    assert moved(before, after) == {
        ("queue", "root.p.x", "fpga"): (0, 1),
        ("queue", "root.p.y", "fpga"): (0, 1),
        ("subtree", "root.p.x", "fpga"): (0, 1),
        ("subtree", "root.p", "fpga"): (0, 2),
        ("subtree", "root", "fpga"): (0, 2),
    }
    assert orphans(postgres_url) == 0
    assert ledger.audit() == []


def test_an_existing_key_and_a_key_repeated_in_the_call_are_declined(
    ledger: QuotaEngine, postgres_url: URL
) -> None:
    kept = ledger.reserve("root.a", {"fpga": 1}, key="k1")
    calls = [
        plain(ledger, "root.a", {"fpga": 1}, key="k1"),  # exists
        plain(ledger, "root.a", {"fpga": 1}),
        plain(ledger, "root.a", {"fpga": 1}, key="k2"),
        plain(ledger, "root.a", {"fpga": 1}, key="k2"),  # the same key again in this call
        plain(ledger, "root.a", {"fpga": 2}, key="k3"),
    ]
    ids = [c["id"] for c in calls]
    before = counters(postgres_url)
    answer = call(ledger, reserve_many(calls))
    # those whose key is taken were not inserted: they charge nothing and hold no one back
    assert [row.idx for row in answer] == [2, 3, 5]
    assert set(stored(postgres_url, ids)) == {ids[1], ids[2], ids[4]}
    assert rows(postgres_url, 'SELECT "key", id FROM reservations WHERE "key" IS NOT NULL ORDER BY 1') == [
        ("k1", kept.id),
        ("k2", ids[2]),
        ("k3", ids[4]),
    ]
    assert moved(before, counters(postgres_url)) == {
        ("queue", "root.a", "fpga"): (0, 4),
        ("subtree", "root.a", "fpga"): (0, 4),
        ("subtree", "root", "fpga"): (0, 4),
    }
    assert ledger.get(kept.id) == kept
    assert ledger.get_by_key("k2").id == ids[2]
    assert orphans(postgres_url) == 0
    assert ledger.audit() == []


def test_an_existing_id_is_declined(ledger: QuotaEngine, postgres_url: URL) -> None:
    kept = ledger.reserve("root.a", {"fpga": 1})
    calls = [plain(ledger, "root.a", {"fpga": 2}), plain(ledger, "root.a", {"fpga": 1})]
    calls[0]["id"] = kept.id
    answer = call(ledger, reserve_many(calls))
    assert [row.idx for row in answer] == [2]
    assert stored(postgres_url, [kept.id]) == {kept.id: ("pending", [("fpga", 1, None)])}
    assert ledger.usage("root.a")["fpga"].reserved == 2
    assert ledger.audit() == []


def test_another_configuration_version_declines_them_all(ledger: QuotaEngine, postgres_url: URL) -> None:
    calls = [plain(ledger, "root.a", {"fpga": 1}, key="v"), plain(ledger, "root.p.x", {"fpga": 1})]
    ledger.set_limits("root.a", {"fpga": 4, "memory": "4Gi"})  # a newer version than the calls name
    before = counters(postgres_url)
    journal_rows = rows(postgres_url, "SELECT count(*) FROM quota_journal")
    assert call(ledger, reserve_many(calls)) == []
    assert stored(postgres_url, [c["id"] for c in calls]) == {}
    assert rows(postgres_url, "SELECT count(*) FROM reservations WHERE \"key\" = 'v'") == [(0,)]
    assert counters(postgres_url) == before
    assert rows(postgres_url, "SELECT count(*) FROM quota_journal") == journal_rows
    assert ledger.audit() == []


def test_only_the_partition_asked_for_is_charged(ledger: QuotaEngine, postgres_url: URL) -> None:
    ledger.set_limits("root.a", {"fpga": 2}, partition="other")
    ledger.rollback(ledger.reserve("root.a", {"fpga": 1}, partition="other").id)
    calls = [plain(ledger, "root.a", {"fpga": 1}, partition="other") for _ in range(3)]
    mine, theirs = counters(postgres_url), counters(postgres_url, "other")
    answer = call(ledger, reserve_many(calls))
    assert [row.idx for row in answer] == [1, 2]
    assert counters(postgres_url) == mine
    assert moved(theirs, counters(postgres_url, "other")) == {
        ("queue", "root.a", "fpga"): (0, 2),
        ("subtree", "root.a", "fpga"): (0, 2),
    }
    assert ledger.get(calls[0]["id"]).partition == "other"
    assert ledger.audit() == []


# -- quota_ledger_commit_many ------------------------------------------------------------------
def test_plain_commits_move_reserved_to_in_use_with_journal_rows(
    ledger: QuotaEngine, postgres_url: URL
) -> None:
    ledger.set_limits("root.a", {"fpga": 4}, partition="other")
    made = [
        ledger.reserve("root.a", {"fpga": 2, "memory": GI}, key="m1"),
        ledger.reserve("root.p.x", {"fpga": 1}),
        ledger.reserve("root.a", {"fpga": 3}, partition="other"),
        ledger.reserve("root.a", {"fpga": 1}),
    ]
    ids = [r.id for r in made]
    ops = [f"op-{n}" for n in range(len(made))]
    before, other_before = counters(postgres_url), counters(postgres_url, "other")
    answer = call(
        ledger, pg_functions.commit_many([{"id": i, "op": o} for i, o in zip(ids, ops, strict=True)], True)
    )
    assert sorted(row.idx for row in answer) == [1, 2, 3, 4]
    for row in answer:
        wanted = made[row.idx - 1]
        assert (row.partition, row.queue, row.key) == (wanted.partition, wanted.queue, wanted.key)
        assert dict(zip(row.resources, row.amounts, strict=True)) == wanted.resources
        done = commit_function.committed(wanted.id, row)
        assert done == ledger.get(wanted.id)
        assert done.state is ReservationState.COMMITTED
        assert done.committed == wanted.resources
    assert stored(postgres_url, ids) == {
        ids[0]: ("committed", [("fpga", 2, 2), ("memory", GI, GI)]),
        ids[1]: ("committed", [("fpga", 1, 1)]),
        ids[2]: ("committed", [("fpga", 3, 3)]),
        ids[3]: ("committed", [("fpga", 1, 1)]),
    }
    assert sorted(journal(postgres_url, ids)) == sorted(
        [
            (ids[0], "fpga", 2, "commit", "op-0"),
            (ids[0], "memory", GI, "commit", "op-0"),
            (ids[1], "fpga", 1, "commit", "op-1"),
            (ids[2], "fpga", 3, "commit", "op-2"),
            (ids[3], "fpga", 1, "commit", "op-3"),
        ]
    )
    assert moved(before, counters(postgres_url)) == {
        ("queue", "root.a", "fpga"): (3, -3),
        ("queue", "root.a", "memory"): (GI, -GI),
        ("subtree", "root.a", "fpga"): (3, -3),
        ("subtree", "root.a", "memory"): (GI, -GI),
        ("queue", "root.p.x", "fpga"): (1, -1),
        ("subtree", "root.p.x", "fpga"): (1, -1),
        ("subtree", "root.p", "fpga"): (1, -1),
        ("subtree", "root", "fpga"): (4, -4),
    }
    assert moved(other_before, counters(postgres_url, "other")) == {
        ("queue", "root.a", "fpga"): (3, -3),
        ("subtree", "root.a", "fpga"): (3, -3),
    }
    assert ledger.audit() == []


def test_repeats_unknown_ids_and_resolved_or_expired_ones_are_declined(
    ledger: QuotaEngine, postgres_url: URL
) -> None:
    first = ledger.reserve("root.a", {"fpga": 1})
    late = ledger.reserve("root.a", {"fpga": 2})
    done = ledger.reserve("root.a", {"fpga": 1})
    ledger.commit(done.id)
    gone = ledger.reserve("root.a", {"fpga": 1})
    ledger.rollback(gone.id)
    last = ledger.reserve("root.p.y", {"fpga": 1})
    execute(
        postgres_url,
        "UPDATE reservations SET expires_at = TIMEZONE('UTC', clock_timestamp()) - interval '1 second'"
        " WHERE id = :id",
        {"id": late.id},
    )
    ids = [first.id, first.id, "00000000-0000-0000-0000-000000000000", late.id, done.id, gone.id, last.id]
    before = counters(postgres_url)
    answer = call(
        ledger, pg_functions.commit_many([{"id": i, "op": f"op-{n}"} for n, i in enumerate(ids, 1)], True)
    )
    assert sorted((row.idx, row.queue) for row in answer) == [(1, "root.a"), (7, "root.p.y")]
    assert journal(postgres_url, [first.id, late.id, last.id]) == sorted(
        [
            (first.id, "fpga", 1, "commit", "op-1"),  # once, by its first place in the call
            (last.id, "fpga", 1, "commit", "op-7"),
        ]
    )
    assert ledger.get(late.id).state is ReservationState.PENDING  # left to the caller to expire
    assert ledger.get(gone.id).state is ReservationState.ROLLED_BACK
    assert moved(before, counters(postgres_url)) == {
        ("queue", "root.a", "fpga"): (1, -1),
        ("subtree", "root.a", "fpga"): (1, -1),
        ("queue", "root.p.y", "fpga"): (1, -1),
        ("subtree", "root.p", "fpga"): (1, -1),
        ("subtree", "root", "fpga"): (2, -2),
    }
    assert ledger.audit() == []


TRACKED_CONFIG = """
partitions:
- name: default
  queues:
  - name: root
    queues:
    - name: org
      limits:
      - users: ["*"]
        maxresources: {fpga: 8}
      - groups: [dev]
        maxresources: {fpga: 10}
      queues:
      - name: team
        resources: {max: {fpga: 20}}
    - name: plain
"""


def identity_counters(url: URL) -> dict[tuple[str, str, str, str], tuple[int, int]]:
    return {
        (kind, name, queue, resource): (int(in_use), int(reserved))
        for kind, name, queue, resource, in_use, reserved in rows(
            url, "SELECT kind, name, queue, resource, in_use, reserved FROM quota_identity_usages"
        )
    }


def test_a_tracked_reservation_among_plain_ones_is_committed_with_its_counters(
    ledger: QuotaEngine, postgres_url: URL
) -> None:
    ledger.apply_config(TRACKED_CONFIG, allow_removing_all=True)
    before_plain = ledger.reserve("root.org.team", {"fpga": 1})
    tracked = ledger.reserve("root.org.team", {"fpga": 2}, user="ann", groups=["dev"], application="ann-app")
    after_plain = ledger.reserve("root.plain", {"fpga": 1})
    identities, before = identity_counters(postgres_url), counters(postgres_url)
    ids = [before_plain.id, tracked.id, after_plain.id]
    answer = call(
        ledger, pg_functions.commit_many([{"id": i, "op": f"op-{n}"} for n, i in enumerate(ids)], True)
    )
    by_idx = {row.idx: row for row in answer}
    assert sorted(by_idx) == [1, 2, 3]
    assert (by_idx[2].user_name, by_idx[2].application) == ("ann", "ann-app")
    assert (by_idx[1].user_name, by_idx[3].queue) == (None, "root.plain")
    for n, reservation in enumerate((before_plain, tracked, after_plain), 1):
        assert commit_function.committed(reservation.id, by_idx[n]) == ledger.get(reservation.id)
    assert journal(postgres_url, ids) == sorted(
        [
            (before_plain.id, "fpga", 1, "commit", "op-0"),
            (tracked.id, "fpga", 2, "commit", "op-1"),
            (after_plain.id, "fpga", 1, "commit", "op-2"),
        ]
    )
    # the user's and the group's counters moved from reserved to in use, by the tracked one only
    assert moved(identities, identity_counters(postgres_url)) == {
        ("user", "ann", "root.org", "fpga"): (2, -2),
        ("group", "dev", "root.org", "fpga"): (2, -2),
    }
    assert moved(before, counters(postgres_url)) == {
        ("queue", "root.org.team", "fpga"): (3, -3),
        ("subtree", "root.org.team", "fpga"): (3, -3),
        ("queue", "root.plain", "fpga"): (1, -1),
        ("subtree", "root", "fpga"): (4, -4),
    }
    (usage,) = rows(postgres_url, "SELECT \"usage\" FROM quota_applications WHERE application = 'ann-app'")[0]
    assert json.loads(usage)["fpga"] == [2, 0]
    assert ledger.audit() == []


def test_a_tracked_one_its_commit_declines_leaves_the_others_committed(
    ledger: QuotaEngine, postgres_url: URL
) -> None:
    ledger.apply_config(TRACKED_CONFIG, allow_removing_all=True)
    tracked = ledger.reserve("root.org.team", {"fpga": 2}, user="ann", groups=["dev"], application="ann-app")
    others = [ledger.reserve("root.org.team", {"fpga": 1}), ledger.reserve("root.plain", {"fpga": 1})]
    identities, before = identity_counters(postgres_url), counters(postgres_url)
    # without its application row quota_ledger_commit declines the tracked one
    execute(postgres_url, "UPDATE quota_applications SET app_key = 'hidden' WHERE application = 'ann-app'")
    ids = [others[0].id, tracked.id, others[1].id]
    made = [{"id": i, "op": f"op-{n}"} for n, i in enumerate(ids)]
    # unguarded, the tracked one's decline aborts the whole call: nothing is committed
    assert (
        ledger.driver.call(
            pg_functions.commit_many(made, False).sql, pg_functions.commit_many(made, False).params
        )
        is None
    )
    assert identity_counters(postgres_url) == identities
    assert counters(postgres_url) == before
    answer = call(ledger, pg_functions.commit_many(made, True))
    execute(postgres_url, "UPDATE quota_applications SET app_key = 'ann-app' WHERE application = 'ann-app'")
    assert sorted(row.idx for row in answer) == [1, 3]
    assert stored(postgres_url, [tracked.id]) == {tracked.id: ("pending", [("fpga", 2, None)])}
    assert journal(postgres_url, [tracked.id]) == []
    assert identity_counters(postgres_url) == identities
    assert moved(before, counters(postgres_url)) == {
        ("queue", "root.org.team", "fpga"): (1, -1),
        ("subtree", "root.org.team", "fpga"): (1, -1),
        ("queue", "root.plain", "fpga"): (1, -1),
        ("subtree", "root", "fpga"): (2, -2),
    }
    assert ledger.audit() == []
    assert ledger.commit(tracked.id).state is ReservationState.COMMITTED  # decided alone
    assert ledger.audit() == []


BIGINT_MAX = 9223372036854775807


def test_a_counter_at_the_bigint_limit_declines(ledger: QuotaEngine, postgres_url: URL) -> None:
    ledger.rollback(ledger.reserve("root.u", {"fpga": 1}).id)  # an unlimited queue's counters
    near = "UPDATE quota_usages SET in_use = in_use + :d WHERE scope_type = 'queue' AND scope = 'root.u'"
    execute(postgres_url, near, {"d": BIGINT_MAX - 10})
    try:
        calls = [
            plain(ledger, "root.a", {"fpga": 1}),
            plain(ledger, "root.u", {"fpga": 6}),
            plain(ledger, "root.u", {"fpga": 5}),  # 10 + 1 would pass the bigint limit
        ]
        answer = call(ledger, reserve_many(calls))
        assert [row.idx for row in answer] == [1, 2]
        assert set(stored(postgres_url, [c["id"] for c in calls])) == {calls[0]["id"], calls[1]["id"]}
        # committing the 6 alongside another would pass it too: every plain one is declined
        plain_one = ledger.reserve("root.a", {"fpga": 1})
        execute(postgres_url, near, {"d": 5})
        before = counters(postgres_url)
        ids = [calls[1]["id"], plain_one.id]
        assert call(ledger, pg_functions.commit_many([{"id": i, "op": "op"} for i in ids], True)) == []
        assert counters(postgres_url) == before
        assert {state for state, _ in stored(postgres_url, ids).values()} == {"pending"}
        assert journal(postgres_url, ids) == []
    finally:
        execute(
            postgres_url,
            "UPDATE quota_usages SET in_use = 0 WHERE scope_type = 'queue' AND scope = 'root.u'",
        )
    assert ledger.audit() == []
