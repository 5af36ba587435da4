"""``quota_ledger_commit_many`` on tracked reservations (a user, an application), which it
commits as a set: each application row once, each identity counter once with the sum.

Path-specific, and so here, the function called directly as a batch calls it: that one call
commits them all at one instant (each application's in-use area integrated up to it exactly),
what it declines and leaves to each reservation's own call (a tracked one whose application row
is missing; all of them when the sums would pass the 64-bit range), and that a batch hands its
tracked commits to one call. What tracked commits decided together leave, whichever decides
them, is tested on every decision path (``test_tracked_batches.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
from sql_rows import execute, rows
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine, ReservationState
from quota_ledger.driver import pg_functions
from quota_ledger.driver.pg_cursor import Call, PgCursor
from quota_ledger.ledger import commit_function
from quota_ledger.model.values import Reservation

BIGINT_MAX = 9223372036854775807

CONFIG = """
partitions:
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


@pytest.fixture
def ledger(postgres_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(postgres_url)
    engine.apply_config(CONFIG.format(name="default"))
    yield engine
    engine.close()


# (queue, resources, user, groups, application): several reservations of one application,
# users and groups shared between applications, a user's own bucket (no application), a user
# whose groups have no limit, and plain ones in between
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
]


def reserve_all(ledger: QuotaEngine, partition: str) -> list[Reservation]:
    """REQUESTS reserved in ``partition``, after a first commit of app-1 (in use before the call)
    and app-4 (in use, then nothing: a slot that the call brings back)."""
    for queue, resources, user, groups, application in (
        ("root.org.team", {"fpga": 1, "asic": 1}, "ann", ["dev"], "app-1"),
        ("root.org.lab", {"fpga": 1}, "ann", ["dev"], "app-4"),
    ):
        ledger.commit(
            ledger.reserve(
                queue,
                resources,
                user=user,
                groups=groups,
                application=application,
                partition=partition,
                key=f"first-{application}",
            ).id
        )
    return [
        ledger.reserve(
            queue,
            resources,
            user=user,
            groups=groups,
            application=application,
            partition=partition,
            key=f"k{n}",
        )
        for n, (queue, resources, user, groups, application) in enumerate(REQUESTS)
    ]


def ids_of(made: Sequence[Reservation]) -> list[str]:
    return [r.id for r in made]


def commit_many(ledger: QuotaEngine, ids: Sequence[str], guard: bool = True) -> list[Any]:
    made: Call = pg_functions.commit_many([{"id": i, "op": f"op-{n}"} for n, i in enumerate(ids)], guard)
    answer = ledger.driver.call(made.sql, made.params)
    assert answer is not None
    return answer


def applications(url: URL, partition: str) -> dict[str, dict[str, Any]]:
    found = rows(
        url,
        'SELECT app_key, application, user_name, queue, group_name, state, pending, "usage", area,'
        " submitted_at, started_at, changed_at FROM quota_applications WHERE partition = :p",
        {"p": partition},
    )
    return {
        key: {
            "fixed": (application, user, queue, group, state, pending, json.loads(usage)),
            "area": {k: Decimal(v) for k, v in json.loads(area).items()},
            "usage": json.loads(usage),
            "started_at": started,
            "changed_at": changed,
        }
        for key, application, user, queue, group, state, pending, usage, area, _, started, changed in found
    }


def ledger_rows(url: URL, partition: str) -> dict[str, Any]:
    """Everything a commit writes in ``partition`` but the applications' areas and the times."""
    p = {"p": partition}
    return {
        "reservations": rows(
            url,
            "SELECT key, state, resolved_at IS NOT NULL FROM reservations WHERE partition = :p ORDER BY key",
            p,
        ),
        "items": rows(
            url,
            "SELECT r.key, i.resource, i.amount, i.committed FROM reservation_items i"
            " JOIN reservations r ON r.id = i.reservation_id WHERE r.partition = :p"
            " ORDER BY r.key, i.resource",
            p,
        ),
        # in the order written (the operation ids of the test's calls only)
        "journal": rows(
            url,
            "SELECT r.key, j.queue, j.resource, j.delta, j.kind,"
            " CASE WHEN j.operation_id LIKE 'op-%' THEN j.operation_id END FROM quota_journal j"
            " LEFT JOIN reservations r ON r.id = j.reservation_id WHERE j.partition = :p ORDER BY j.id",
            p,
        ),
        "usages": rows(
            url,
            "SELECT scope_type, scope, resource, in_use, reserved, hard_limit FROM quota_usages"
            " WHERE partition = :p ORDER BY scope_type, scope, resource",
            p,
        ),
        "identities": rows(
            url,
            "SELECT kind, name, queue, resource, in_use, reserved, hard_limit FROM quota_identity_usages"
            " WHERE partition = :p ORDER BY kind, name, queue, resource",
            p,
        ),
        "applications": {k: v["fixed"] for k, v in applications(url, partition).items()},
    }


def micros(later: datetime, earlier: datetime) -> int:
    delta = later - earlier
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def integrated(before: Mapping[str, Any], now: datetime) -> dict[str, Decimal]:
    """An application's area integrated from its changed_at up to ``now`` (quota_ledger_commit's
    rule: each resource in use, times the microseconds since)."""
    area = dict(before["area"])
    if now > before["changed_at"]:
        span = micros(now, before["changed_at"])
        for resource, (in_use, _) in before["usage"].items():
            if in_use:
                area[resource] = area.get(resource, Decimal(0)) + in_use * span
    return area


def test_one_call_commits_them_all_at_one_instant(ledger: QuotaEngine, postgres_url: URL) -> None:
    made = reserve_all(ledger, "default")
    # the areas so far: every application last changed 5 s ago
    execute(
        postgres_url,
        "UPDATE quota_applications"
        " SET changed_at = TIMEZONE('UTC', clock_timestamp()) - interval '5 seconds'",
    )
    before = applications(postgres_url, "default")
    answer = commit_many(ledger, ids_of(made))
    assert sorted(row.idx for row in answer) == list(range(1, len(REQUESTS) + 1))
    (now,) = {row.resolved_at for row in answer}  # one instant for the whole call
    for row in answer:
        reservation = made[row.idx - 1]
        assert commit_function.committed(reservation.id, row) == ledger.get(reservation.id)
        assert (row.user_name, row.application) == (reservation.user, reservation.application)
    after = applications(postgres_url, "default")
    assert after.keys() == {"app-1", "app-2", "app-3", "app-4", "\tann\troot.org.team"}
    for key, app in after.items():
        assert app["changed_at"] == now
        assert app["started_at"] == (before[key]["started_at"] or now)
        assert app["area"] == integrated(before[key], now)
    assert after["app-1"]["area"]["fpga"] >= 5_000_000  # in use for 5 s before the call
    assert after["app-1"]["fixed"][5:] == (0, {"asic": [6, 0], "fpga": [4, 0]})  # nothing pending
    assert after["app-2"]["started_at"] == now  # its first commit
    assert ledger.audit() == []


def test_a_tracked_one_without_its_application_row_is_declined_alone(
    ledger: QuotaEngine, postgres_url: URL
) -> None:
    made = reserve_all(ledger, "default")
    ids = ids_of(made)
    before = ledger_rows(postgres_url, "default")
    # both of app-2's reservations lose their application row; the others are committed
    execute(postgres_url, "UPDATE quota_applications SET app_key = 'hidden' WHERE application = 'app-2'")
    try:
        answer = commit_many(ledger, ids)
    finally:
        execute(postgres_url, "UPDATE quota_applications SET app_key = 'app-2' WHERE application = 'app-2'")
    declined = {n for n, (*_, application) in enumerate(REQUESTS, 1) if application == "app-2"}
    assert sorted(row.idx for row in answer) == sorted(set(range(1, len(REQUESTS) + 1)) - declined)
    after = ledger_rows(postgres_url, "default")
    for n in declined:
        assert ledger.get(ids[n - 1]).state is ReservationState.PENDING
        assert all(key != f"k{n - 1}" for key, *_ in after["journal"])
    # bob's counters: nothing moved (only app-2 is bob's)
    bobs = [[r for r in found["identities"] if r[1] == "bob"] for found in (before, after)]
    assert bobs[0]
    assert bobs[1] == bobs[0]
    assert after["applications"]["app-2"] == before["applications"]["app-2"]
    assert ledger.audit() == []
    for n in sorted(declined):  # decided alone
        assert ledger.commit(ids[n - 1]).state is ReservationState.COMMITTED
    assert ledger.audit() == []


def test_tracked_ones_whose_sum_would_pass_the_bigint_limit_are_all_declined(
    ledger: QuotaEngine, postgres_url: URL
) -> None:
    made = reserve_all(ledger, "default")
    ids = ids_of(made)
    # bob's user counter on root.org: room for each of app-2's two fpga commits alone, not both
    near = (
        "UPDATE quota_identity_usages SET in_use = in_use + :d"
        " WHERE kind = 'user' AND name = 'bob' AND queue = 'root.org' AND resource = 'fpga'"
    )
    execute(postgres_url, near, {"d": BIGINT_MAX - 1})
    try:
        before = ledger_rows(postgres_url, "default")
        assert commit_many(ledger, ids) == []
        assert ledger_rows(postgres_url, "default") == before
        # each alone fits: the engine's own call commits it
        assert len(commit_many(ledger, [ids[2]])) == 1
    finally:
        execute(postgres_url, near, {"d": -(BIGINT_MAX - 1)})
    assert ledger.audit() == []


def test_a_batch_hands_its_tracked_commits_to_one_call(
    postgres_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    real = PgCursor.pipelined

    def spy(fast: PgCursor, calls: Sequence[Call]) -> list[list[Any]]:
        sizes.extend(len(c.params["ids"]) for c in calls if "quota_ledger_commit_many(" in c.sql)
        return real(fast, calls)

    monkeypatch.setattr(PgCursor, "pipelined", spy)
    engine = QuotaEngine.from_url(postgres_url, batching=True, pool_size=4)
    try:
        engine.apply_config(CONFIG.format(name="default"))
        made = reserve_all(engine, "default")
        sizes.clear()
        committed = engine.decide_all([engine.prepare_commit(r.id) for r in made])
        assert all(isinstance(c, Reservation) and c.state is ReservationState.COMMITTED for c in committed)
        assert sizes == [len(REQUESTS)]
        assert engine.audit() == []
    finally:
        engine.close()
