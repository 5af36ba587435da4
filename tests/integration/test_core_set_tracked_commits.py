"""Group commit on MariaDB and SQLite decides whole commits of tracked reservations (a user, an
application) as a set too (:mod:`quota_ledger.ledger.resolve_set`): each application row locked
and written once, each user/group counter locked once and charged once with the sum.

The same reservations are made in two partitions of one database; one partition's commits are
decided as one batch, the twin's one after another without batching, in the same order. With
the database clock pinned to one instant for every commit (the set reads it once; one by one,
each commit would read its own), and the applications' times made equal beforehand, both must
leave the same rows: reservations, items, journal, counters, user/group counters and
application rows, in-use areas and times included.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from sql_rows import Statements
from sqlalchemy import select, update
from sqlalchemy.engine import URL

from quota_ledger import CounterOverflow, QuotaEngine, ReservationState
from quota_ledger.driver.schema import (
    quota_applications,
    quota_identity_usages,
    quota_journal,
    quota_usages,
    reservation_items,
    reservations,
)
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import resolve_set
from quota_ledger.model.values import Reservation, StoredReservation

BIGINT_MAX = 9223372036854775807
TWINS = ("set", "alone")
CONFIG = """
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

# (queue, resources, user, groups, application): several reservations of one application (app-1
# three, app-2 three, the last of them on asic alone), users and groups shared between
# applications, a user's own bucket (no application), a user whose group has no limit, an
# application whose first commit is in this set, and plain ones in between
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


class Clock:
    """The database clock as commits read it (when a reservation row is locked): pinned to
    ``at`` while it is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.at: datetime | None = None
        one, many = LedgerTx.lock_reservation, LedgerTx.lock_reservations

        def lock_one(tx: LedgerTx, reservation_id: str) -> tuple[StoredReservation, datetime] | None:
            found = one(tx, reservation_id)
            return found if found is None or self.at is None else (found[0], self.at)

        def lock_many(tx: LedgerTx, ids: Any) -> tuple[list[StoredReservation], datetime | None]:
            stored, now = many(tx, ids)
            return stored, now if now is None or self.at is None else self.at

        monkeypatch.setattr(LedgerTx, "lock_reservation", lock_one)
        monkeypatch.setattr(LedgerTx, "lock_reservations", lock_many)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


@pytest.fixture
def unbatched(core_db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(core_db_url)
    engine.apply_config(
        "partitions:" + "".join(CONFIG.format(name=n) for n in TWINS), allow_removing_all=True
    )
    yield engine
    engine.close()


@pytest.fixture
def batched(core_db_url: URL, unbatched: QuotaEngine) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(core_db_url, batching=True, pool_size=4)
    yield engine
    engine.close()


def reserve_all(engine: QuotaEngine, partition: str) -> list[Reservation]:
    """REQUESTS reserved in ``partition``, after a first commit of app-1 (in use before the set),
    app-4 (in use, then released: nothing in use) and app-5 (finished once its last request is
    reserved: it is committed all the same)."""
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


def same_times(engine: QuotaEngine) -> datetime:
    """Give every application row, and the rows of what was done so far, the same times, five
    seconds ago, and no area so far (the applications' in-use areas then grow alike up to a
    commit); the database clock now."""
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
    return now


def ledger_rows(engine: QuotaEngine, partition: str) -> dict[str, list[tuple[Any, ...]]]:
    """Everything a commit writes in ``partition``, but ids (journal rows in the order written)."""
    r, i, j = reservations.c, reservation_items.c, quota_journal.c
    u, d, a = quota_usages.c, quota_identity_usages.c, quota_applications.c
    queries = {
        "reservations": select(r.key, r.queue, r.state, r.user_name, r.application, r.resolved_at)
        .where(r.partition == partition)
        .order_by(r.key),
        "items": select(r.key, i.resource, i.amount, i.committed)
        .join_from(reservation_items, reservations, r.id == i.reservation_id)
        .where(r.partition == partition)
        .order_by(r.key, i.resource),
        "journal": select(r.key, j.queue, j.resource, j.delta, j.kind, j.created_at)
        .join_from(quota_journal, reservations, r.id == j.reservation_id, isouter=True)
        .where(j.partition == partition)
        .order_by(j.id),
        "counters": select(u.scope_type, u.scope, u.resource, u.in_use, u.reserved, u.hard_limit)
        .where(u.partition == partition)
        .order_by(u.scope_type, u.scope, u.resource),
        "identities": select(d.kind, d.name, d.queue, d.resource, d.in_use, d.reserved, d.hard_limit)
        .where(d.partition == partition)
        .order_by(d.kind, d.name, d.queue, d.resource),
        "applications": select(*(c for c in quota_applications.c if c.name not in ("id", "partition")))
        .where(a.partition == partition)
        .order_by(a.app_key),
    }
    return engine.driver.run(
        lambda tx: {name: [tuple(row) for row in tx.conn.execute(query)] for name, query in queries.items()}
    )


def commit_set(engine: QuotaEngine, made: Sequence[Reservation]) -> list[Any]:
    return engine.decide_all([engine.prepare_commit(each.id) for each in made])


def commit_alone(engine: QuotaEngine, made: Sequence[Reservation]) -> list[Any]:
    outcomes: list[Any] = []
    for each in made:
        try:
            outcomes.append(engine.commit(each.id))
        except CounterOverflow as error:
            outcomes.append(error)
    return outcomes


def test_tracked_commits_as_a_set_leave_the_rows_of_commits_one_by_one(
    batched: QuotaEngine, unbatched: QuotaEngine, clock: Clock
) -> None:
    made = {partition: reserve_all(unbatched, partition) for partition in TWINS}
    clock.at = same_times(unbatched)
    assert ledger_rows(unbatched, "set") == ledger_rows(unbatched, "alone")
    statements = Statements(batched)
    together = commit_set(batched, made["set"])
    alone = commit_alone(unbatched, made["alone"])
    assert all(isinstance(c, Reservation) and c.state is ReservationState.COMMITTED for c in together)
    assert [c.committed for c in together] == [c.committed for c in alone] == [r[1] for r in REQUESTS]
    assert statements.count < 40  # a dozen for the set, four application rows written
    found = ledger_rows(unbatched, "set")
    assert found == ledger_rows(unbatched, "alone")
    apps = {row[0]: row for row in found["applications"]}
    # app-1: in use for five seconds before the set, its three commits moved to in use
    assert apps["app-1"][6:9] == (
        0,
        '{"asic": [6, 0], "fpga": [4, 0]}',
        '{"asic": "5000000", "fpga": "5000000"}',
    )
    assert apps["app-3"][10] == clock.at  # started by its commit in the set
    assert unbatched.audit() == []


def test_a_tracked_commit_that_would_overflow_is_left_to_its_step_and_later_ones_of_its_application_are_not(
    batched: QuotaEngine, unbatched: QuotaEngine, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    made = {partition: reserve_all(unbatched, partition) for partition in TWINS}
    clock.at = same_times(unbatched)
    # bob's user counter on root.org: room for app-2's first fpga commit, not its second; its
    # third (asic alone) fits
    d = quota_identity_usages.c
    bobs = (d.kind == "user") & (d.name == "bob") & (d.queue == "root.org") & (d.resource == "fpga")

    def near(delta: int) -> None:
        def work(tx: LedgerTx) -> None:
            tx.conn.execute(update(quota_identity_usages).where(bobs).values(in_use=d.in_use + delta))

        unbatched.driver.run(work)

    near(BIGINT_MAX - 1)
    with caplog.at_level(logging.WARNING, logger="quota_ledger.group_commit"):
        together = commit_set(batched, made["set"])
    # the set did not fail on the database's range check (other loggers, such as the
    # application summaries, may be at INFO after another test)
    assert [r for r in caplog.records if r.name == "quota_ledger.group_commit"] == []
    alone = commit_alone(unbatched, made["alone"])
    overflows = [n for n, c in enumerate(together) if isinstance(c, CounterOverflow)]
    assert overflows == [n for n, c in enumerate(alone) if isinstance(c, CounterOverflow)] == [8]
    assert ledger_rows(unbatched, "set") == ledger_rows(unbatched, "alone")
    near(-(BIGINT_MAX - 1))
    assert unbatched.audit() == []
    assert batched.commit(made["set"][8].id).state is ReservationState.COMMITTED
    assert unbatched.commit(made["alone"][8].id).state is ReservationState.COMMITTED
    assert unbatched.audit() == []


def test_a_tracked_one_without_its_application_row_is_left_to_its_step(unbatched: QuotaEngine) -> None:
    made = reserve_all(unbatched, "set")
    a = quota_applications.c

    def hide(key: str, as_key: str) -> None:
        def work(tx: LedgerTx) -> None:
            tx.conn.execute(
                update(quota_applications)
                .where(a.partition == "set", a.app_key == key)
                .values(app_key=as_key)
            )

        unbatched.driver.run(work)

    hide("app-2", "hidden")
    try:
        decided = unbatched.driver.run(
            lambda tx: resolve_set.decide(tx, [(r.id, f"op-{n}") for n, r in enumerate(made)])
        )
    finally:
        hide("hidden", "app-2")
    left = {n for n, (*_, application) in enumerate(REQUESTS) if application == "app-2"}
    assert sorted(decided) == sorted(set(range(len(REQUESTS))) - left)
    for n in left:
        assert unbatched.get(made[n].id).state is ReservationState.PENDING
    assert unbatched.audit() == []
    for n in sorted(left):
        assert unbatched.commit(made[n].id).state is ReservationState.COMMITTED
    assert unbatched.audit() == []


def test_eight_tracked_commits_take_far_fewer_statements_as_a_set_than_one_by_one(
    batched: QuotaEngine, unbatched: QuotaEngine
) -> None:
    made = {
        partition: [
            unbatched.reserve(
                "root.org.lab",
                {"fpga": 1, "asic": 1},
                user=f"user-{n % 6 % 4}",
                groups=["dev"],
                application=f"app-{n % 6}",
                partition=partition,
            )
            for n in range(8)
        ]
        for partition in TWINS
    }
    as_set, one_by_one = Statements(batched), Statements(unbatched)
    together = commit_set(batched, made["set"])
    alone = commit_alone(unbatched, made["alone"])
    assert all(isinstance(c, Reservation) for c in [*together, *alone])
    # the set: its locks and writes (the six application rows with one statement)
    assert as_set.count <= 14
    assert one_by_one.count >= 4 * as_set.count
    assert unbatched.audit() == []


def test_threads_reserving_and_committing_tracked_requests_end_exact(
    batched: QuotaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    real = resolve_set.decide

    def spy(tx: LedgerTx, commits: Sequence[tuple[str, str]]) -> dict[int, Any]:
        decided = real(tx, commits)
        sizes.append(sum(1 for n in decided if decided[n][0].user is not None))
        return decided

    monkeypatch.setattr(resolve_set, "decide", spy)
    users = ("ann", "bob", "carol")
    unexpected: list[BaseException] = []

    def caller(n: int) -> None:
        user = users[n % len(users)]
        for k in range(6):
            try:
                made = batched.reserve(
                    "root.org.team" if n % 2 else "root.org.lab",
                    {"fpga": 1, "asic": 1 + n % 2},
                    user=user,
                    groups=["dev"],
                    application=None if k % 3 == 2 else f"{user}-{n % 2}",
                    partition="set",
                )
                assert batched.commit(made.id).state is ReservationState.COMMITTED
            except BaseException as error:  # reported below
                unexpected.append(error)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert unexpected == []
    assert max(sizes, default=0) > 1, sizes  # tracked commits decided as a set
    usage = batched.usage("root.org", partition="set")
    assert {r: (u.in_use, u.reserved) for r, u in usage.items()} == {"fpga": (36, 0), "asic": (54, 0)}
    assert batched.audit() == []
