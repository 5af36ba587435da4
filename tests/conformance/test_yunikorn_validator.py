"""YuniKorn's validator tests, pkg/common/configs/configvalidator_test.go (apache/yunikorn-core).

The tables of TestCheckLimitResource, TestCheckLimitMaxApplications, TestCheckLimits and
TestCheckPlacementRule are kept in ``data/yunikorn_configvalidator_test.yaml`` (Go structs as
YuniKorn's YAML keys); each runs through the ledger's check of the same name. The name tables
of TestUserName, TestGroupName, TestServiceAccountUserName and TestServiceAccountGroupName
and the cases of TestIsQueueNameValid are below, each run as a whole configuration, and those of
TestCheckNodeSortingPolicy, run through the ledger's check of the same name.
"""

from __future__ import annotations

from typing import Any

import pytest
from upstream_cases import agree, load, params

from quota_ledger.config.model import Partition, PlacementRule, Queue
from quota_ledger.config.placement import check_rule
from quota_ledger.config.user_group_checks import Report, check_limit_hierarchy, check_queue_limits
from quota_ledger.config.validate import check_node_sort_policy
from quota_ledger.ledger import configure

FILE = "pkg/common/configs/configvalidator_test.go"
TABLE = load("yunikorn_configvalidator_test.yaml")


def _quantity_problem(message: str) -> bool:
    return "is not a valid amount" in message or "is too large" in message


def _each_queue(queue: Queue, path: str) -> list[tuple[Queue, str]]:
    found = [(queue, path)]
    for child in queue.queues:
        found += _each_queue(child, f"{path}.{child.name}")
    return found


def run_check(test: str, case: dict[str, Any]) -> list[str]:
    """The problems the ledger's counterpart of upstream's checked function reports."""
    report = Report("default")
    if test == "TestCheckPlacementRule":
        rule = PlacementRule.model_validate(case["rule"])
        check_rule(report, rule, 0)
        return [p.message for p in report.problems]
    queue = Queue.model_validate(case["queue"])
    if test == "TestCheckLimits":
        check_queue_limits(report, queue, queue.name, is_root=False)
        return [p.message for p in report.problems]
    check_limit_hierarchy(report, queue, queue.name)
    messages = [p.message for p in report.problems]
    if test == "TestCheckLimitResource":  # upstream parses the amounts there; the ledger one step before
        parsing = Report("default")
        for each, path in _each_queue(queue, queue.name):
            check_queue_limits(parsing, each, path, is_root=False)
        messages += [p.message for p in parsing.problems if _quantity_problem(p.message)]
    return messages


@pytest.mark.parametrize(("case", "reason"), params(TABLE["cases"]))
def test_validator_table_outcome(case: dict[str, Any], reason: str | None) -> None:
    messages = run_check(case["test"], case)
    outcome = "refused" if messages else "accepted"
    agree(outcome == case["expect"], reason, (FILE, case["test"], case["case"], messages))


def _filter_document(users: list[str], groups: list[str]) -> dict[str, Any]:
    rule = {"name": "user", "filter": {"users": users, "groups": groups}}
    return {"partitions": [{"name": "default", "queues": [{"name": "root"}], "placementrules": [rule]}]}


NAME_TABLES = [
    # (upstream test, users or groups, names accepted, names refused)
    (
        "TestUserName",
        "users",
        ["username-allowed_99", "username", "username*regexp", "user_name", "user@name@", "username$$"],
        ["username rejected", "", "rejected!name", "!rejected", " rejected "],
    ),
    (
        "TestGroupName",
        "groups",
        ["groupname-allowed_99", "groupname", "groupname*regexp", "group_name", "group-name"],
        ["groupname ", "group@name", "group name", " groupname ", "!groupname"],
    ),
    (
        "TestServiceAccountUserName",
        "users",
        [
            "system:serviceaccounts:username:username-77",
            "system:serviceaccounts:username:regexp*",
            "system:serviceaccounts:username.12:username-77-11",
            "system:serviceaccounts:username:username",
        ],
        [
            "system:serviceaccounts:username!:username",
            "system:serviceaccounts:username xyz:username",
            "system:serviceaccounts: :username",
            "system:serviceaccounts: username:username",
            "system:\\:username",
            " system:serviceaccounts:username:username",
        ],
    ),
    (
        "TestServiceAccountGroupName",
        "groups",
        [
            "system:authenticated",
            "system:unauthenticated",
            "system:serviceaccounts:groupname",
            "system:serviceaccounts:groupname.12",
            "system:serviceaccounts:groupname-1-test.test",
        ],
        [
            "system:\\:groupname",
            "system:serviceaccounts: groupname",
            "system:!:groupname",
            "system:&:groupname",
            " system:authenticated",
        ],
    ),
]
NAME_CASES = [
    pytest.param(kind, name, accepted, id=f"{test}-{'accepted' if accepted else 'refused'}-{name!r}")
    for test, kind, allowed, rejected in NAME_TABLES
    for names, accepted in ((allowed, True), (rejected, False))
    for name in names
]


@pytest.mark.parametrize(("kind", "name", "accepted"), NAME_CASES)
def test_placement_filter_names(kind: str, name: str, accepted: bool) -> None:
    """A one-entry filter list holds a valid name or a regular expression (checkPlacementFilter)."""
    users, groups = ([name], ["ok"]) if kind == "users" else (["ok"], [name])
    _, problems = configure.check(_filter_document(users, groups))
    assert (problems == []) is accepted, problems


@pytest.mark.parametrize(
    ("name", "accepted"),
    [("parent_Child_test-a_b_#_c_#_d_/_e@dom:ain", True), ("invalid!queue", False), ("root.parent", False)],
    ids=repr,
)
def test_is_queue_name_valid(name: str, accepted: bool) -> None:
    """TestIsQueueNameValid, as a child queue of root."""
    document = {"partitions": [{"name": "default", "queues": [{"name": "root", "queues": [{"name": name}]}]}]}
    _, problems = configure.check(document)
    assert (problems == []) is accepted, problems


NODE_SORTING = {
    "Valid Sorting Policy with Positive Weights": (
        {"type": "fair", "resourceweights": {"memory": 1.0}},
        True,
    ),
    "Negative Resource Weight": ({"type": "fair", "resourceweights": {"memory": -1.0}}, False),
    "Undefined Sorting Policy": ({"type": "undefinedPolicy", "resourceweights": {"memory": 1.0}}, False),
    "Valid Policy with Multiple Resources": (
        {"type": "binpacking", "resourceweights": {"memory": 2.0, "cpu": 3.0}},
        True,
    ),
}


@pytest.mark.parametrize(
    ("policy", "accepted"),
    [pytest.param(*row, id=f"TestCheckNodeSortingPolicy-{name}") for name, row in NODE_SORTING.items()],
)
def test_check_node_sorting_policy(policy: dict[str, Any], accepted: bool) -> None:
    partition = Partition.model_validate({"queues": [], "nodesortpolicy": policy})
    report = Report("default")
    check_node_sort_policy(report, partition)
    assert (report.problems == []) is accepted, report.problems
    if accepted:  # kept as written
        assert partition.nodesortpolicy is not None
        assert (partition.nodesortpolicy.type, partition.nodesortpolicy.resourceweights) == (
            policy["type"],
            policy["resourceweights"],
        )


# TestCheckPlacementRules: upstream's createQueueConfig() and createPlacementRules(), then variants
PLACEMENT_QUEUES = [
    {
        "name": "root",
        "parent": True,
        "queues": [
            {"name": "users", "parent": True},
            {"name": "devs", "parent": True, "queues": [{"name": "yunikorn", "parent": True}]},
            {"name": "default", "parent": False},
            {"name": "admins", "parent": True},
        ],
    }
]
USER_UNDER_TAG_UNDER_USERS = {
    "name": "user",
    "parent": {"name": "tag", "value": "namespace", "parent": {"name": "fixed", "value": "root.users"}},
}
DEV_UNDER_ADMINS = {
    "name": "fixed",
    "value": "dev",
    "create": True,
    "parent": {"name": "fixed", "value": "admins"},
}
PLACEMENT_RULES = {
    "default case, no error": ([USER_UNDER_TAG_UNDER_USERS, DEV_UNDER_ADMINS], None),
    "referencing a parent queue as the last of a fixed path": (
        [{"name": "fixed", "value": "root.users"}],
        "placement rule #0 (fixed) names queue root.users, which is not a leaf queue",
    ),
    "referencing root.admins.dev, which does not exist, with create false": (
        [USER_UNDER_TAG_UNDER_USERS, {**DEV_UNDER_ADMINS, "create": False}],
        "placement rule #1 (fixed->fixed) names queue root.admins.dev, which does not exist",
    ),
    "referencing root.default.leaf under the leaf default": (
        [{"name": "fixed", "value": "root.default.leaf"}],
        "placement rule #0 (fixed) names queue root.default.leaf, which cannot be created: default is a leaf",
    ),
    "two fixed rules of a chain with fully qualified queues": (
        [
            {
                "name": "fixed",
                "value": "root.default.leaf",
                "parent": {"name": "fixed", "value": "root.default"},
            }
        ],
        "placement rule #0: only the first 'fixed' rule of a chain may name a full queue path",
    ),
}


@pytest.mark.parametrize(
    ("rules", "problem"),
    [pytest.param(*row, id=f"TestCheckPlacementRules-{name}") for name, row in PLACEMENT_RULES.items()],
)
def test_check_placement_rules(rules: list[dict[str, Any]], problem: str | None) -> None:
    document = {"partitions": [{"name": "default", "queues": PLACEMENT_QUEUES, "placementrules": rules}]}
    _, found = configure.check(document)
    if problem is None:
        assert found == []
    else:
        assert [p.message for p in found if p.message.startswith(problem)], found
