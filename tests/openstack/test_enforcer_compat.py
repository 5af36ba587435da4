"""The ledger's enforcer answers as oslo.limit's own, case by case, under oslo.limit's
LimitFixture: with the service counting (a usage callback) and with the ledger counting
(usage claimed first), for enforce, claim, calculate_usage and the limit lookups."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from oslo_config import cfg
from oslo_config import fixture as config_fixture
from oslo_limit import exception, fixture, limit

from quota_ledger import QuotaEngine
from quota_ledger.openstack import Enforcer
from quota_ledger.openstack.sources import OsloLimitSource
from quota_ledger.openstack.sync import KeystoneSync

# LimitFixture's fake Keystone objects use an openstacksdk call deprecated for removal
pytestmark = pytest.mark.filterwarnings("ignore:The _compute_attributes method is deprecated")

REGISTERED = {"widgets": 100, "sprockets": 50, "gadgets": -1, "nothing": 0}
PROJECTS = {"project2": {"widgets": 10}, "project3": {"sprockets": -1, "nothing": 2}}


@pytest.fixture(autouse=True)
def keystone_limits() -> Iterator[fixture.LimitFixture]:
    """oslo.limit's options naming an endpoint, and its fixture answering for Keystone."""
    with config_fixture.Config(cfg.CONF) as conf:
        conf.config(group="oslo_limit", endpoint_id="ENDPOINT_ID")
        with fixture.LimitFixture(REGISTERED, PROJECTS) as limits:
            yield limits


@pytest.fixture
def engine(sqlite_template: Path, tmp_path: Path) -> Iterator[QuotaEngine]:
    path = tmp_path / "ledger.db"
    shutil.copy(sqlite_template, path)
    with QuotaEngine.from_url(f"sqlite:///{path}") as ledger:
        yield ledger


def answer(call: Any) -> Any:
    """What a call returned, or the facts of the ProjectOverLimit it raised."""
    try:
        return ("ok", call())
    except exception.ProjectOverLimit as over:
        return (
            "over",
            over.project_id,
            [(i.resource_name, i.limit, i.current_usage, i.delta) for i in over.over_limit_info_list],
        )


def counting(usage: dict[str, int]) -> Any:
    return lambda project_id, names: {name: usage.get(name, 0) for name in names}


def claimed(engine: QuotaEngine, project: str, usage: dict[str, int]) -> Enforcer:
    """An enforcer on ``engine`` with ``usage`` of ``project`` claimed and committed."""
    enforcer = Enforcer(None, ledger=engine)
    held = {name: amount for name, amount in usage.items() if amount}
    if held:
        with enforcer.claim(project, held):
            pass
    return enforcer


# (project, its current usage, the deltas asked for)
CASES = {
    "under the registered limits": (
        "project1",
        {"sprockets": 10, "widgets": 10},
        {"sprockets": 1, "widgets": 1},
    ),
    "over a registered limit": (
        "project1",
        {"sprockets": 10, "widgets": 10},
        {"sprockets": 1, "widgets": 91},
    ),
    "exactly at the limit": ("project1", {"widgets": 99}, {"widgets": 1}),
    "over every limit asked, by name": ("project1", {"widgets": 5}, {"widgets": 96, "sprockets": 51}),
    "over a project's own limit": ("project2", {"widgets": 3}, {"widgets": 8}),
    "under a project's own limit": ("project2", {"widgets": 3}, {"widgets": 7}),
    "a resource nothing registers is refused": ("project1", {}, {"unknown": 1, "widgets": 1}),
    "a resource nothing registers, delta 0": ("project1", {}, {"unknown": 0}),
    "a registered -1 is unlimited": ("project1", {"gadgets": 5}, {"gadgets": 10**9}),
    "a project's -1 is unlimited": ("project3", {"sprockets": 70}, {"sprockets": 10**9}),
    "a registered 0 refuses": ("project1", {}, {"nothing": 1}),
    "a project's own limit over a registered 0": ("project3", {"nothing": 1}, {"nothing": 1}),
    "delta 0 at the limit": ("project2", {"widgets": 10}, {"widgets": 0}),
}


@pytest.mark.parametrize("case", CASES)
def test_enforce_answers_as_oslo_limit(case: str, engine: QuotaEngine) -> None:
    project, usage, deltas = CASES[case]
    expected = answer(lambda: limit.Enforcer(counting(usage)).enforce(project, deltas))
    assert answer(lambda: Enforcer(counting(usage)).enforce(project, deltas)) == expected
    ledger = claimed(engine, project, usage)
    assert answer(lambda: ledger.enforce(project, deltas)) == expected


@pytest.mark.parametrize("case", CASES)
def test_a_claim_is_refused_exactly_when_oslo_limit_refuses(case: str, engine: QuotaEngine) -> None:
    project, usage, deltas = CASES[case]
    expected = answer(lambda: limit.Enforcer(counting(usage)).enforce(project, deltas))
    ledger = claimed(engine, project, usage)
    before = ledger.calculate_usage(project, sorted(deltas))

    def claim() -> None:
        with ledger.claim(project, deltas) as held:
            held.rollback()

    if expected[0] == "ok" and not any(deltas.values()):
        with pytest.raises(ValueError, match="positive delta"):
            claim()
    else:
        assert answer(claim) == expected
    assert ledger.calculate_usage(project, sorted(deltas)) == before


@pytest.mark.parametrize("project", ["project1", "project2", "project3"])
def test_calculate_usage_and_limits_answer_as_oslo_limit(project: str, engine: QuotaEngine) -> None:
    usage = {"widgets": 4, "sprockets": 2}
    names = ["widgets", "sprockets", "gadgets", "nothing", "unknown"]
    oslo = limit.Enforcer(counting(usage))
    for enforcer in (Enforcer(counting(usage)), claimed(engine, project, usage)):
        assert enforcer.calculate_usage(project, names) == oslo.calculate_usage(project, names)
        assert enforcer.get_project_limits(project, names) == oslo.get_project_limits(project, names)
        assert enforcer.get_project_limits(project, None) == oslo.get_project_limits(project, None)
        assert enforcer.get_registered_limits(names) == oslo.get_registered_limits(names)
        assert sorted(enforcer.get_registered_limits(None)) == sorted(oslo.get_registered_limits(None))


def test_registered_limits_alone_without_a_project() -> None:
    usage = {"widgets": 100}
    expected = answer(lambda: limit.Enforcer(counting(usage)).enforce(None, {"widgets": 1}))
    assert expected[0] == "over"
    assert answer(lambda: Enforcer(counting(usage)).enforce(None, {"widgets": 1})) == expected
    assert Enforcer(counting(usage)).calculate_usage(None, ["widgets"]) == limit.Enforcer(
        counting(usage)
    ).calculate_usage(None, ["widgets"])


@pytest.mark.parametrize(
    ("project", "deltas"),
    [("", {"widgets": 1}), (7, {"widgets": 1}), ("project1", {}), ("project1", {"widgets": "1"}), ("p", [])],
)
def test_invalid_arguments_are_refused_as_oslo_limit_refuses_them(project: Any, deltas: Any) -> None:
    with pytest.raises(ValueError) as theirs:
        limit.Enforcer(counting({})).enforce(project, deltas)
    with pytest.raises(ValueError) as ours:
        Enforcer(counting({})).enforce(project, deltas)
    assert str(ours.value) == str(theirs.value)


def test_a_usage_callback_missing_a_resource_is_an_error_as_in_oslo_limit() -> None:
    def silent(project_id: str | None, names: Any) -> dict[str, int]:
        return {}

    with pytest.raises(ValueError, match="unable to get current usage for widgets"):
        limit.Enforcer(silent).enforce("project1", {"widgets": 1})
    with pytest.raises(ValueError, match="unable to get current usage for widgets"):
        Enforcer(silent).enforce("project1", {"widgets": 1})


def test_the_enforcer_takes_a_callback_or_a_ledger(engine: QuotaEngine) -> None:
    with pytest.raises(ValueError, match="either"):
        Enforcer(counting({}), ledger=engine)
    with pytest.raises(ValueError, match="either"):
        Enforcer(None)
    with pytest.raises(ValueError, match="callable"):
        Enforcer(42)  # type: ignore[arg-type]


def test_claims_need_the_ledger() -> None:
    enforcer = Enforcer(counting({}))
    with pytest.raises(ValueError, match="ledger="), enforcer.claim("project1", {"widgets": 1}):
        pass


def test_the_limits_read_through_the_fixture_become_the_projects_queues(engine: QuotaEngine) -> None:
    enforcer = Enforcer(None, ledger=engine)
    enforcer.enforce("project2", {"widgets": 1})
    enforcer.enforce("project3", {"sprockets": 1})
    limits = engine.limits()
    assert limits["root.project2"]["widgets"] == 10
    assert "sprockets" not in limits["root.project3"]
    assert limits["root.project3"]["nothing"] == 2


def test_the_keystone_sync_reads_through_oslo_limit_too(engine: QuotaEngine) -> None:
    result = KeystoneSync(engine, OsloLimitSource()).sync_once()
    assert result.queues == ("root.project2", "root.project3")
    limits = engine.limits()
    assert (limits["root.project2"]["widgets"], limits["root.project2"]["sprockets"]) == (10, 50)
    assert "gadgets" not in limits["root.project2"]
    assert (limits["root.project3"]["widgets"], limits["root.project3"]["nothing"]) == (100, 2)
