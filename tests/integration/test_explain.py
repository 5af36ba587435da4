"""``QuotaEngine.explain``: what ``reserve`` would decide now, why, and who holds the capacity,
writing nothing; on every decision path."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_dump import dump

from quota_ledger import (
    Explanation,
    HolderKind,
    OverQuota,
    QuotaEngine,
    QuotaLedgerError,
    UnknownResource,
)

CONFIG = """
partitions:
- name: default
  queues:
  - name: root
    queues:
    - name: team
      maxapplications: 3
      resources: {max: {vcore: 10, memory: 10Gi}}
      limits:
      - users: [alice]
        maxresources: {vcore: 6}
      - groups: [dev]
        maxresources: {memory: 8Gi}
      queues:
      - name: a
        maxapplications: 3
      - name: b
        maxapplications: 3
"""


@pytest.fixture
def ledger(path_ledger: QuotaEngine) -> QuotaEngine:
    path_ledger.apply_config(CONFIG)
    return path_ledger


def test_an_admitted_request_is_explained_and_nothing_is_written(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "2"}, user="alice", application="app-1")
    before = dump(ledger)
    explained = ledger.explain("root.team.a", {"vcore": "4"}, user="alice", application="app-2")
    assert explained.admitted
    assert (explained.violations, explained.blockers, explained.ahead) == ([], (), None)
    assert dump(ledger) == before


def test_a_refusal_names_every_limit_and_its_largest_holders(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "3"}, user="alice", application="big")
    ledger.reserve("root.team.a", {"vcore": "1"}, user="alice", application="small")
    ledger.reserve("root.team.b", {"vcore": "2"}, user="bob")  # bob's bucket: no application
    ledger.reserve("root.team.b", {"vcore": "1"})  # no user, no application
    before = dump(ledger)
    explained = ledger.explain("root.team.a", {"vcore": "4"}, user="alice", application="new")
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.team.a", {"vcore": "4"}, user="alice", application="new")
    assert not explained.admitted
    assert explained.violations == refused.value.violations
    assert dump(ledger) == before
    by_kind = {(b.violation.kind, b.violation.scope): b for b in explained.blockers}
    assert set(by_kind) == {("queue", "root.team"), ("user", "root.team")}
    queue = by_kind[("queue", "root.team")]
    assert queue.violation.shortfall == 4000 - (10000 - 7000)
    assert [(h.kind, h.name, h.queue, h.reserved) for h in queue.holders] == [
        (HolderKind.APPLICATION, "big", "root.team.a", 3000),
        (HolderKind.USER, "bob", "root.team.b", 2000),
        (HolderKind.APPLICATION, "small", "root.team.a", 1000),
        (HolderKind.QUEUE, "root.team.b", "root.team.b", 1000),
    ]
    user = by_kind[("user", "root.team")]
    assert user.violation.name == "alice"
    assert [h.name for h in user.holders] == ["big", "small"]  # only alice's
    assert explained.holders[user.violation] == user.holders


def test_holders_are_the_five_largest(ledger: QuotaEngine) -> None:
    ledger.set_limits("root.team", {"memory": "100Gi"})
    for n in range(7):
        ledger.reserve("root.team.b", {"memory": f"{n + 1}Gi"}, user=f"u{n}")
    explained = ledger.explain("root.team.b", {"memory": "90Gi"})
    (blocker,) = explained.blockers
    assert [h.name for h in blocker.holders] == ["u6", "u5", "u4", "u3", "u2"]
    assert [h.held for h in blocker.holders] == sorted((h.held for h in blocker.holders), reverse=True)


def test_a_full_maxapplications_names_the_running_applications(ledger: QuotaEngine) -> None:
    for name in ("first", "second", "third"):
        ledger.reserve("root.team.a", {"vcore": "1"}, user="carol", application=name)
    explained = ledger.explain("root.team.a", {"vcore": "1"}, user="carol", application="fourth")
    assert not explained.admitted
    assert {(b.violation.scope, b.violation.resource, b.violation.limit) for b in explained.blockers} == {
        ("root.team", "applications", 3),
        ("root.team.a", "applications", 3),
    }
    for blocker in explained.blockers:
        assert [(h.name, h.in_use) for h in blocker.holders] == [("first", 1), ("second", 1), ("third", 1)]
    # an application already running needs no new slot
    assert ledger.explain("root.team.a", {"vcore": "1"}, user="carol", application="first").admitted


def test_other_refusals_are_raised_as_reserve_raises_them(ledger: QuotaEngine) -> None:
    config = CONFIG.replace("- name: default\n", "- name: default\n  unknownnames: refuse\n")
    ledger.apply_config(config)
    with pytest.raises(UnknownResource):
        ledger.reserve("root.team.a", {"vcroe": "1"})
    with pytest.raises(UnknownResource):
        ledger.explain("root.team.a", {"vcroe": "1"})


def test_a_used_key_is_explained_as_the_reservation_it_returns(ledger: QuotaEngine) -> None:
    ledger.reserve("root.team.a", {"vcore": "8"}, key="k-1")
    assert ledger.explain("root.team.a", {"vcore": "8"}, key="k-1").admitted
    assert not ledger.explain("root.team.a", {"vcore": "8"}, key="k-2").admitted


T = TypeVar("T")
QUEUES = ("root.team.a", "root.team.b")
USERS = (None, "alice", "bob")
requests = st.tuples(
    st.sampled_from(QUEUES),
    st.integers(min_value=1, max_value=7),
    st.integers(min_value=0, max_value=6),
    st.sampled_from(USERS),
    st.sampled_from((None, "x", "y", "z")),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(requests, min_size=1, max_size=8))
def test_explain_agrees_with_reserve_in_any_state(
    ledger: QuotaEngine, history: list[tuple[str, int, int, str | None, str | None]]
) -> None:
    """Each request is explained, then reserved in the same state: both decide alike."""
    made = []
    for queue, vcore, memory, user, application in history:
        resources = {"vcore": str(vcore), "memory": f"{memory}Gi"}
        app = f"{user}-{application}" if user and application else None
        groups = ["dev"] if user == "bob" else []
        kwargs: dict[str, Any] = {"user": user, "groups": groups, "application": app}
        explained = _outcome(partial(ledger.explain, queue, resources, **kwargs))
        done = _outcome(partial(ledger.reserve, queue, resources, **kwargs))
        if isinstance(done, OverQuota):
            assert isinstance(explained, Explanation)
            assert not explained.admitted
            assert explained.violations == done.violations
        elif isinstance(done, QuotaLedgerError):  # another refusal: explain raised it too
            assert type(explained) is type(done)
        else:
            assert isinstance(explained, Explanation)
            assert explained.admitted
            made.append(done)
    for reservation in made:
        ledger.rollback(reservation.id)


def _outcome(call: Callable[[], T]) -> T | QuotaLedgerError:
    try:
        return call()
    except QuotaLedgerError as error:
        return error
