"""YuniKorn's user and group manager, pkg/scheduler/ugm/manager_test.go (apache/yunikorn-core).

TestCanRunApp and TestUserGroupLimit, on the ledger (SQLite: the behaviour is not
backend-specific). Each case configures its limits, reserves a first application's usage for
the user, and asks for a second application: upstream checks ``CanRunApp`` and the headroom
separately; the ledger's reservation must be refused for each that upstream finds wanting
(``applications`` for the count, the resources for the headroom), and only for those.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from upstream_cases import agree

from quota_ledger import ConfigError, OverQuota, QuotaEngine

FILE = "pkg/scheduler/ugm/manager_test.go"
MEDIUM = {"memory": "50", "vcores": "50"}
LARGE = {"memory": "100", "vcores": "100"}
LONE_GROUP_WILDCARD = (
    "the configuration is validated first, and YuniKorn's own validator refuses a lone group "
    "wildcard too (the upstream test gives the limits to the tracker without validating them)"
)


@pytest.fixture
def ledger(sqlite_template: Path, tmp_path: Path) -> Iterator[QuotaEngine]:
    path = tmp_path / "ledger.db"
    shutil.copy(sqlite_template, path)
    engine = QuotaEngine.from_url(f"sqlite:///{path}")
    yield engine
    engine.close()


def limit(users: list[str], groups: list[str], resources: dict[str, str] | None, apps: int) -> dict[str, Any]:
    found: dict[str, Any] = {"users": users, "groups": groups, "maxapplications": apps}
    if resources is not None:
        found["maxresources"] = resources
    return found


def configuration(partition: str, queue: str, limits: list[dict[str, Any]]) -> dict[str, Any]:
    leaf = {"name": queue, "parent": queue == "parent", "submitacl": "*", "limits": limits}
    return {
        "partitions": [
            {
                "name": partition,
                "queues": [{"name": "root", "parent": True, "submitacl": "*", "queues": [leaf]}],
            }
        ]
    }


CAN_RUN_APP = {
    "specific user limit": [limit(["user1"], [], None, 1)],
    "specific group limit": [limit([], ["group1"], None, 1)],
    "wildcard user limit": [limit(["*"], [], None, 1)],
    "wildcard group limit": [limit([], ["nonexistent-group"], None, 100), limit([], ["*"], None, 1)],
    "specific user lower than specific group limit": [
        limit(["user1"], [], None, 1),
        limit([], ["group1"], None, 100),
    ],
    "specific group lower than specific user limit": [
        limit(["user1"], [], None, 100),
        limit([], ["group1"], None, 1),
    ],
}


@pytest.mark.parametrize("limits", [pytest.param(v, id=f"TestCanRunApp-{k}") for k, v in CAN_RUN_APP.items()])
def test_can_run_app(ledger: QuotaEngine, limits: list[dict[str, Any]]) -> None:
    ledger.apply_config(configuration("default", "default", limits))
    who = {"user": "user1", "groups": ["group1"]}
    ledger.reserve("root.default", {"memory": "50"}, application="test-app-1", **who)
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.default", {"memory": "50"}, application="test-app-2", **who)
    assert {v.resource for v in refused.value.violations} == {"applications"}


SIZES = {"medium": MEDIUM, "large": LARGE}
# (name, user, groups, limits as (users, groups, maxresources, maxapplications),
#  canRunApp, isHeadroomAvailable)
USER_GROUP_LIMIT = [
    (
        "maxresources with a specific user limit",
        "user1",
        ["group1"],
        [(["user1"], [], "medium", 2)],
        True,
        False,
    ),
    (
        "maxapplications with a specific user limit",
        "user1",
        ["group1"],
        [(["user1"], [], "large", 1)],
        False,
        True,
    ),
    (
        "maxresources with a specific user limit and a wildcard user limit for a not specific user",
        "user2",
        ["group2"],
        [(["user1"], [], "large", 2), (["*"], [], "medium", 2)],
        True,
        False,
    ),
    (
        "maxapplications with a specific user limit and a wildcard user limit for a not specific user",
        "user2",
        ["group2"],
        [(["user1"], [], "large", 2), (["*"], [], "large", 1)],
        False,
        True,
    ),
    (
        "maxresources with a specific user limit and a wildcard user limit for a specific user",
        "user1",
        ["group1"],
        [(["user1"], [], "medium", 2), (["*"], [], "large", 2)],
        True,
        False,
    ),
    (
        "maxapplications with a specific user limit and a wildcard user limit for a specific user",
        "user1",
        ["group1"],
        [(["user1"], [], "large", 1), (["*"], [], "large", 2)],
        False,
        True,
    ),
    ("maxresources with a wildcard user limit", "user1", ["group1"], [([], ["*"], "medium", 2)], True, False),
    (
        "maxapplications with a wildcard user limit",
        "user1",
        ["group1"],
        [([], ["*"], "large", 1)],
        False,
        True,
    ),
    (
        "maxresources with a specific group limit",
        "user1",
        ["group1"],
        [([], ["group1"], "medium", 2)],
        True,
        False,
    ),
    (
        "maxapplications with a specific group limit",
        "user1",
        ["group1"],
        [([], ["group1"], "large", 1)],
        False,
        True,
    ),
    (
        "maxresources with a specific group limit and a wildcard group limit for a not specific group user",
        "user2",
        ["group2"],
        [([], ["group1"], "large", 2), ([], ["*"], "medium", 2)],
        True,
        False,
    ),
    (
        "maxapplications with a specific group limit and a wildcard group limit "
        "for a not specific group user",
        "user2",
        ["group2"],
        [([], ["group1"], "large", 2), ([], ["*"], "large", 1)],
        False,
        True,
    ),
    (
        "maxresources with a specific group limit and a wildcard group limit for a specific group user",
        "user1",
        ["group1"],
        [([], ["group1"], "medium", 2), ([], ["*"], "large", 2)],
        True,
        False,
    ),
    (
        "maxapplications with a specific group limit and a wildcard group limit for a specific group user",
        "user1",
        ["group1"],
        [([], ["group1"], "large", 1), ([], ["*"], "large", 2)],
        False,
        True,
    ),
    (
        "maxresources with user limit lower than group limit",
        "user1",
        ["group1"],
        [(["user1"], [], "medium", 2), ([], ["group1"], "large", 2)],
        True,
        False,
    ),
    (
        "maxapplications with user limit lower than group limit",
        "user1",
        ["group1"],
        [(["user1"], [], "large", 1), ([], ["group1"], "large", 2)],
        False,
        True,
    ),
    (
        "maxresources with gorup limit lower than user limit",
        "user1",
        ["group1"],
        [(["user1"], [], "large", 2), ([], ["group1"], "medium", 2)],
        True,
        False,
    ),
    (
        "maxapplications with group limit lower than user limit",
        "user1",
        ["group1"],
        [(["user1"], [], "large", 2), ([], ["group1"], "large", 1)],
        False,
        True,
    ),
]
USER_GROUP_LIMIT_DIFFERS = {
    "maxresources with a wildcard user limit": LONE_GROUP_WILDCARD,
    "maxapplications with a wildcard user limit": LONE_GROUP_WILDCARD,
}


@pytest.mark.parametrize(
    ("user", "groups", "limits", "can_run", "headroom", "reason"),
    [
        pytest.param(
            *row[1:], USER_GROUP_LIMIT_DIFFERS.get(row[0]),
            id=f"TestUserGroupLimit-{row[0]}{'-differs' if row[0] in USER_GROUP_LIMIT_DIFFERS else ''}",
        )
        for row in USER_GROUP_LIMIT
    ],
)  # fmt: skip
def test_user_group_limit(
    ledger: QuotaEngine,
    user: str,
    groups: list[str],
    limits: list[tuple[list[str], list[str], str, int]],
    can_run: bool,
    headroom: bool,
    reason: str | None,
) -> None:
    document = configuration(
        "test", "parent", [limit(u, g, SIZES[size], apps) for u, g, size, apps in limits]
    )
    try:
        ledger.apply_config(document)
    except ConfigError as error:
        agree(False, reason, (FILE, "TestUserGroupLimit", error.problems))
        return
    who = {"user": user, "groups": groups, "partition": "test"}
    ledger.reserve("root.parent", MEDIUM, application="test-app-1", **who)  # within the first headroom
    wanting = set() if can_run else {"applications"}
    wanting |= set() if headroom else {"memory", "vcores"}
    try:
        ledger.reserve("root.parent", MEDIUM, application="test-app-2", **who)
        refused: set[str] = set()
    except OverQuota as error:
        refused = {v.resource for v in error.violations}
    agree(refused == wanting, reason, (FILE, "TestUserGroupLimit", refused, wanting))
