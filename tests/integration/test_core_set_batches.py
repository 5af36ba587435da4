"""Group commit's sets on MariaDB and SQLite (:func:`quota_ledger.ledger.reserve.decide` for
many requests, :func:`.resolve.commit_set`): what only these paths have.

What a batch decides, plain or tracked, is tested on every decision path
(``test_batches_decide_as_alone.py``, ``test_tracked_batches.py``). Path-specific, and so
here: that a set sends a few statements for the whole batch where the requests one by one send
a dozen each; that a tracked commit whose application row is missing is committed by a set as by
its own step; and that a set that raises is undone to its savepoint and its requests are
decided by their steps in the same batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from partition_rows import partition_rows, without_areas
from sql_rows import Statements, execute
from sqlalchemy import update
from sqlalchemy.engine import URL

from quota_ledger import OverQuota, QuotaEngine, ReservationNotFound, ReservationState, ReservationStateError
from quota_ledger.driver.schema import quota_applications
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import resolve
from quota_ledger.ledger.group_commit import GroupCommit
from quota_ledger.model.values import Reservation

ZERO_ID = "00000000-0000-0000-0000-000000000000"
GI = 1 << 30
PARTITION = """
- name: {name}
  queues:
  - name: root
    queues:
    - name: org
      maxapplications: 12
      limits:
      - users: ["*"]
        maxresources: {{fpga: 40, memory: 8Gi}}
        maxapplications: 6
      - groups: [dev]
        maxresources: {{fpga: 60}}
      - groups: ["*"]
        maxresources: {{memory: 6Gi}}
      queues:
      - name: lab
        maxapplications: 12
"""


def config(*partitions: str) -> str:
    return "partitions:" + "".join(PARTITION.format(name=p) for p in partitions)


@pytest.fixture
def batched(core_db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(core_db_url, batching=True, pool_size=4)
    yield engine
    engine.close()


@pytest.fixture
def unbatched(core_db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(core_db_url)
    yield engine
    engine.close()


def test_a_set_of_plain_reserves_and_commits_takes_a_few_statements(batched: QuotaEngine) -> None:
    batched.set_limits("root", {"fpga": 100, "memory": 1000})
    batched.set_limits("root.a", {"fpga": 30})
    batched.set_limits("root.a.x", {"memory": 200})
    batched.set_limits("root.b", {"fpga": 50, "gpu": 4})
    for queue in ("root.a", "root.a.x", "root.b"):  # first uses create the queues' counters
        batched.rollback(batched.reserve(queue, {"fpga": 1, "memory": 1, "gpu": 1}).id)
    requests: list[tuple[str, dict[str, int]]] = [
        ("root.a", {"fpga": 10}),
        ("root.a.x", {"fpga": 5, "memory": 150}),
        ("root.b", {"fpga": 20, "gpu": 2}),
        ("root.a", {"fpga": 10, "memory": 10}),
        ("root.a.x", {"memory": 40}),
        ("root.b", {"gpu": 2}),
        ("root.a", {"fpga": 4}),
        ("root.b", {"gpu": 1}),  # over root.b's gpu: it and every one after go to their steps
        ("root.a", {"fpga": 1}),
        ("root.a.x", {"memory": 20}),  # over root.a.x's memory
    ]
    statements = Statements(batched)
    made = batched.decide_all([batched.prepare_reserve(q, r) for q, r in requests])
    assert [type(o) for o in made] == [*[Reservation] * 7, OverQuota, Reservation, OverQuota]
    # one batch: ~10 statements for the set, then the three steps (a dozen each)
    assert statements.count < 60
    before = statements.count
    committed = batched.decide_all([batched.prepare_commit(r.id) for r in made if isinstance(r, Reservation)])
    assert statements.count - before < 20  # ~8 statements for all eight
    assert all(isinstance(c, Reservation) and c.state is ReservationState.COMMITTED for c in committed)
    assert batched.audit() == []


def test_tracked_first_uses_take_far_fewer_statements_as_a_set_than_one_by_one(
    batched: QuotaEngine, unbatched: QuotaEngine
) -> None:
    unbatched.apply_config(config("set", "alone"))
    for partition in ("set", "alone"):
        unbatched.rollback(
            unbatched.reserve("root.org.lab", {"fpga": 1, "memory": 1}, partition=partition).id
        )
        wanted: list[dict[str, Any]] = [  # three new users, six new applications, two groups
            {"user": f"user-{n % 3}", "groups": ["ops"] if n % 3 else ["dev"], "application": f"app-{n % 6}"}
            for n in range(8)
        ]
        if partition == "set":
            sent = Statements(batched)
            made = batched.decide_all(
                [
                    batched.prepare_reserve("root.org.lab", {"fpga": 1, "memory": GI}, partition="set", **w)
                    for w in wanted
                ]
            )
            together = sent.count
        else:
            sent = Statements(unbatched)
            made = [
                unbatched.reserve("root.org.lab", {"fpga": 1, "memory": GI}, partition="alone", **w)
                for w in wanted
            ]
            alone = sent.count
        assert all(isinstance(r, Reservation) for r in made), made
    assert together * 4 < alone, (together, alone)
    assert batched.audit() == []


def test_eight_tracked_commits_take_far_fewer_statements_as_a_set_than_one_by_one(
    batched: QuotaEngine, unbatched: QuotaEngine
) -> None:
    unbatched.apply_config(config("default"))
    made = {
        mode: [
            unbatched.reserve(
                "root.org.lab",
                {"fpga": 1},
                user=f"user-{n % 6 % 4}",
                groups=["dev"],
                application=f"app-{n % 6}",
            )
            for n in range(8)
        ]
        for mode in ("set", "alone")
    }
    as_set, one_by_one = Statements(batched), Statements(unbatched)
    together = batched.decide_all([batched.prepare_commit(each.id) for each in made["set"]])
    alone = [unbatched.commit(each.id) for each in made["alone"]]
    assert all(isinstance(c, Reservation) for c in [*together, *alone])
    # the set: its locks and writes (the six application rows with one statement)
    assert as_set.count <= 14
    assert one_by_one.count >= 4 * as_set.count
    assert unbatched.audit() == []


def test_partial_and_late_commits_are_one_set_with_the_whole_ones(
    core_db_url: URL, batched: QuotaEngine, unbatched: QuotaEngine, caplog: pytest.LogCaptureFixture
) -> None:
    unbatched.apply_config(config("set", "alone"))
    wanted: list[tuple[dict[str, int], dict[str, Any], dict[str, int] | None]] = [
        ({"fpga": 2}, {"user": "ann", "application": "app-1"}, None),
        ({"fpga": 3, "memory": GI}, {"user": "ann", "application": "app-1"}, {"fpga": 1}),
        ({"fpga": 1}, {"user": "bob", "application": "app-2"}, None),  # late: app-2 stops
        ({"fpga": 1}, {"user": "cid"}, {"fpga": 0}),
        ({"fpga": 1}, {"user": "ann", "application": "app-1"}, None),
    ]
    made = {
        partition: [
            unbatched.reserve("root.org.lab", resources, partition=partition, groups=["dev"], **who)
            for resources, who, _ in wanted
        ]
        for partition in ("set", "alone")
    }
    for partition in ("set", "alone"):
        execute(
            core_db_url,
            "UPDATE reservations SET expires_at = created_at WHERE id = :id",
            {"id": made[partition][2].id},
        )
    batched.driver.run(batched.rules.in_force)  # the configuration compiled before the count
    sent = Statements(batched)
    with caplog.at_level(logging.INFO, logger="quota_ledger.summary"):
        together = batched.decide_all(
            [
                batched.prepare_commit(r.id, amounts)
                for r, (_, _, amounts) in zip(made["set"], wanted, strict=True)
            ]
        )
        statements = sent.count
        alone = []
        for r, (_, _, amounts) in zip(made["alone"], wanted, strict=True):
            try:
                alone.append(unbatched.commit(r.id, amounts))
            except ReservationStateError as error:
                alone.append(error)
    # one set: its locks, a savepoint, its writes (a partial commit: 2); then, as a partial commit
    # frees capacity, one look for a waiting line (at most once per wait_poll_interval)
    assert statements <= 23
    assert [type(o) for o in together] == [type(o) for o in alone]
    assert [type(o) for o in together] == [*[Reservation] * 2, ReservationStateError, *[Reservation] * 2]
    assert [o.committed for o in together if isinstance(o, Reservation)] == [
        {"fpga": 2},
        {"fpga": 1, "memory": 0},
        {"fpga": 0},
        {"fpga": 1},
    ]
    assert without_areas(partition_rows(core_db_url, "set")) == without_areas(
        partition_rows(core_db_url, "alone")
    )
    stopped = [r.getMessage() for r in caplog.records if r.name == "quota_ledger.summary"]
    assert len(stopped) == 2
    assert all('"appId":"app-2"' in line and '"state":"Expired"' in line for line in stopped)
    assert unbatched.audit() == []


def test_a_tracked_commit_without_its_application_row_is_committed_as_alone(
    core_db_url: URL, unbatched: QuotaEngine
) -> None:
    unbatched.apply_config(config("set", "alone"))
    made = {
        partition: [
            unbatched.reserve(
                "root.org.lab", {"fpga": 1}, partition=partition, user=user, groups=["dev"], application=app
            )
            for user, app in (
                ("ann", "app-1"),
                ("bob", "app-2"),
                ("ann", "app-1"),
                ("bob", "app-2"),
                ("cid", None),
            )
        ]
        for partition in ("set", "alone")
    }
    a = quota_applications.c

    def hide(key: str, as_key: str) -> None:
        def work(tx: LedgerTx) -> None:
            tx.conn.execute(update(quota_applications).where(a.app_key == key).values(app_key=as_key))

        unbatched.driver.run(work)

    def alone(tx: LedgerTx) -> None:
        for n, r in enumerate(made["alone"]):
            resolve.commit_general(tx, unbatched.rules, r.id, None, f"op-{n}")

    commits = [(r.id, None, f"op-{n}") for n, r in enumerate(made["set"])]
    hide("app-2", "hidden")
    try:
        decided = unbatched.driver.run(lambda tx: resolve.commit_set(tx, commits, unbatched.rules))
        unbatched.driver.run(alone)
    finally:
        hide("hidden", "app-2")
    assert sorted(decided) == [0, 1, 2, 3, 4]  # as their steps: app-2's row is not there to move
    assert without_areas(partition_rows(core_db_url, "set")) == without_areas(
        partition_rows(core_db_url, "alone")
    )
    assert unbatched.audit() == []


def test_a_set_that_raises_is_undone_and_each_step_decides(
    batched: QuotaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    batched.set_limits("root.u", {"fpga": 5})
    batched.rollback(batched.reserve("root.u", {"fpga": 1}).id)
    inserted: list[int] = []  # by the set's multi-row insert
    failed: list[bool] = []
    insert, add = LedgerTx.insert_reservations, LedgerTx.apply_counter_deltas

    def counted(tx: LedgerTx, rows: Any) -> None:
        inserted.append(len(rows))
        insert(tx, rows)

    def failing_once(tx: LedgerTx, deltas: Any, now: Any) -> None:
        add(tx, deltas, now)  # the set's reservations and counters are written, then
        if inserted and not failed:
            failed.append(True)
            raise ReservationNotFound(ZERO_ID)  # a ledger error: all of it is undone

    monkeypatch.setattr(LedgerTx, "insert_reservations", counted)
    monkeypatch.setattr(LedgerTx, "apply_counter_deltas", failing_once)
    operations = [batched.prepare_reserve("root.u", {"fpga": 2}) for _ in range(3)]
    retries = dict(batched.driver.retries)
    outcomes = _flusher(batched).run_many([o.request for o in operations])
    assert dict(batched.driver.retries) == retries  # the batch ran once
    assert inserted == [2]  # the set admitted two before it failed, and its steps decided them
    assert failed == [True]
    assert batched.batch_stats.fallbacks == 0  # decided in the batch, not one by one after it
    assert [type(o) for o in outcomes] == [Reservation, Reservation, OverQuota]
    assert batched.usage("root.u")["fpga"].reserved == 4
    assert batched.audit() == []


def _flusher(engine: QuotaEngine) -> GroupCommit:
    assert engine.group_commit is not None
    return engine.group_commit
