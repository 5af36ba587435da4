"""YuniKorn's configuration tests, pkg/common/configs/config_test.go (apache/yunikorn-core).

Every YAML document of the file, with the outcome its test asserts (accepted or refused), is
kept in ``data/yunikorn_config_test.yaml``; where upstream names the queue of its error, a
problem must be reported at that queue. Messages are the ledger's own and are not compared.
"""

from __future__ import annotations

from typing import Any

import pytest
from upstream_cases import agree, load, params

from quota_ledger.config import load as load_config
from quota_ledger.config.model import normalize
from quota_ledger.ledger import configure

TABLE = load("yunikorn_config_test.yaml")
CASES = TABLE["cases"]


def by_test(test: str) -> list[dict[str, Any]]:
    return [case for case in CASES if case["test"] == test]


@pytest.mark.parametrize(("case", "reason"), params(CASES))
def test_config_document_outcome(case: dict[str, Any], reason: str | None) -> None:
    _, problems = configure.check(case["document"])
    outcome = "refused" if problems else "accepted"
    same = outcome == case["expect"]
    if same and case.get("queue"):  # upstream names where the error is: so must we
        same = any(p.queue.split(".")[-1] == case["queue"] for p in problems)
    agree(same, reason, (TABLE["file"], case["test"], case["case"], [p.describe() for p in problems]))


def test_partition_limits_without_a_name_load_with_the_name_empty_and_become_root_limits() -> None:
    """TestPartitionLimits: ``- limit:`` with no value; the limits are copied onto root."""
    [case] = by_test("TestPartitionLimits")
    [partition] = normalize(load_config(case["document"])).partitions
    assert [limit.limit for limit in partition.limits] == ["", "", ""]
    assert partition.queues is not None
    assert partition.queues[0].limits == partition.limits
    first, second, third = partition.limits
    assert (first.users, first.maxresources, first.maxapplications) == (
        ("user1",),
        {"memory": "10000", "vcore": "10"},
        5,
    )
    assert (second.users, second.groups, second.maxresources, second.maxapplications) == (
        ("user2",),
        ("prod",),
        {},
        10,
    )
    assert (third.groups, third.maxapplications) == (("dev", "test"), 20)


def test_queue_limits_stay_on_their_queue() -> None:
    """TestQueueLimits: root's limits are not the partition's; level1 keeps its own."""
    [case] = by_test("TestQueueLimits")
    [partition] = normalize(load_config(case["document"])).partitions
    assert partition.limits == ()
    assert partition.queues is not None
    [root] = partition.queues
    assert [limit.users for limit in root.limits] == [("user1",), ("user2",)]
    assert root.queues[0].limits[0].users == ("subuser",)


def test_the_user_group_resolver_is_kept() -> None:
    """TestUserGroupResolverConfig: ``ldap`` is kept; absent means the empty type."""
    with_resolver, without = by_test("TestUserGroupResolverConfig")
    resolver = load_config(with_resolver["document"]).partitions[0].usergroupresolver
    assert resolver is not None
    assert resolver.type == "ldap"
    assert load_config(without["document"]).partitions[0].usergroupresolver is None


def test_preemption_switches_are_kept() -> None:
    """TestPartitionPreemptionParameter: unset, enabled and disabled switches load as written."""
    unset, enabled, disabled = (
        load_config(c["document"]).partitions[0] for c in by_test("TestPartitionPreemptionParameter")
    )
    assert unset.preemption is None
    assert enabled.preemption is not None
    assert disabled.preemption is not None
    assert (enabled.preemption.enabled, enabled.preemption.quotapreemptionenabled) == (True, True)
    assert (disabled.preemption.enabled, disabled.preemption.quotapreemptionenabled) == (False, False)


def test_placement_rules_load_as_written() -> None:
    """TestParseRule: the create flag, parent chain, filter type and lists, values."""
    first, second, third, fourth = (
        load_config(c["document"]).partitions[0] for c in by_test("TestParseRule")
    )
    rule = first.placementrules[0]
    assert (rule.create, rule.parent) == (True, None)
    assert rule.filter is not None
    assert rule.filter.type == "allow"
    assert (len(rule.filter.users), len(rule.filter.groups)) == (2, 2)
    rule = second.placementrules[0]
    assert rule.create is False
    assert rule.parent is not None
    assert rule.parent.create is False
    assert rule.parent.filter is not None
    assert (len(rule.parent.filter.users), len(rule.parent.filter.groups)) == (1, 0)
    assert len(third.placementrules) == 3
    assert [r.value for r in fourth.placementrules] == ["root.default", "Just Any value"]


def test_an_empty_document_is_the_default_configuration() -> None:
    """TestLoadSchedulerConfigFromByteArray "Empty config": no partitions, nothing wrong."""
    config, problems = configure.check("")
    assert (config.partitions, problems) == ((), [])
