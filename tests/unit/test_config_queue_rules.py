"""The validation rules of notes §1.4 and §1.9 for partitions and the queue tree: partition names,
root and queue structure, ACLs and queue names, guaranteed and max resources, placement rules and
maxapplications.

Each rule has a configuration YuniKorn accepts and one it refuses; a refusal is checked for
its partition, full queue path, limit and message.
"""

from __future__ import annotations

from typing import Any

import pytest
from config_builders import AMOUNT, accepted, doc, lim, problems, q, refused, res

from quota_ledger.config.amounts import SUFFIXES
from quota_ledger.config.model import Partition, Queue
from quota_ledger.config.user_group_checks import Report
from quota_ledger.config.validate import INVALID_QUEUE_NAME, check_limits_structure
from quota_ledger.model.values import ConfigProblem

# -- 1.4 step 1: partition names --------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second"), [("default", "DEFAULT"), ("", "default"), ("Default", "")])
def test_duplicate_default_partitions_are_refused(first: str, second: str) -> None:
    source = {"partitions": [{"name": first, "queues": []}, {"name": second, "queues": []}]}
    refused(source, "partition default is configured more than once (names ignore case)")


def test_duplicate_partition_names_differ_only_in_case() -> None:
    source = {"partitions": [{"name": "prod", "queues": []}, {"name": "PROD", "queues": []}]}
    refused(source, "partition PROD is configured more than once (names ignore case)", partition="PROD")


def test_distinct_partitions_are_accepted() -> None:
    accepted({"partitions": [{"name": "", "queues": []}, {"name": "gpu", "queues": []}]})


@pytest.mark.parametrize("name", ["a b", "a\x01", "ä", "x'; DROP TABLE reservations; --", "p" * 65])
def test_partition_names_are_checked_as_reserve_checks_them(name: str) -> None:
    source = {"partitions": [{"name": name, "queues": []}]}
    problem = refused(source, "invalid partition name", partition=name)
    assert problem.queue == ""


# -- 1.4 step 2: queue structure ---------------------------------------------------------------------


def test_a_partition_without_queues_is_refused() -> None:
    refused({"partitions": [{"name": "gpu"}]}, "the partition has no queues", partition="gpu")
    refused({"partitions": [{"name": "gpu", "queues": None}]}, "the partition has no queues", partition="gpu")


def test_an_empty_queue_list_gets_a_root_and_is_accepted() -> None:
    accepted({"partitions": [{"queues": []}]})


@pytest.mark.parametrize(
    "resources", [{"max": {"memory": 10}}, {"guaranteed": {"memory": 1}}, {"max": {}}, {}]
)
def test_root_must_not_have_resources_not_even_empty_ones(resources: dict[str, Any]) -> None:
    refused(doc(resources=resources), "the root queue cannot set resources (guaranteed or max)", queue="root")


def test_root_without_resources_is_accepted() -> None:
    accepted(doc(q("a", resources={"max": {"memory": 10}}, maxapplications=5), maxapplications=5))


# -- 1.4 step 3: limits structure -------------------------------------------------------------------


def test_a_top_queue_that_is_not_root_is_refused_before_normalization() -> None:
    report = Report("default")
    check_limits_structure(report, Partition(queues=(Queue(name="test"),)))
    assert report.problems == [
        ConfigProblem(
            partition="default", queue="test", limit="", message="the top queue must be root, not test"
        )
    ]
    report = Report("default")
    check_limits_structure(report, Partition(queues=(Queue(name="Root"),)))
    assert report.problems == []


def test_partition_and_root_limits_must_be_the_same() -> None:
    sue, bob = lim(users=["sue"], maxapplications=2), lim(users=["bob"], maxapplications=2)
    source = {"partitions": [{"queues": [q("root", limits=[sue])], "limits": [bob]}]}
    refused(source, "the partition's limits and the root queue's limits differ")
    accepted({"partitions": [{"queues": [q("root", limits=[sue])], "limits": [sue]}]})


# -- 1.4 step 4: ACLs and queue names ----------------------------------------------------------------


@pytest.mark.parametrize("acl", ["sue,bob dev,ops", "*", "  sue dev  ", "", " ", "sue", " dev"])
def test_acls_of_at_most_two_fields_are_accepted(acl: str) -> None:
    accepted(doc(q("a", adminacl=acl, submitacl=acl)))


@pytest.mark.parametrize("key", ["adminacl", "submitacl"])
def test_an_acl_with_more_than_two_fields_is_refused(key: str) -> None:
    refused(
        doc(q("a", **{key: "  sue bob dev "})), "ACL 'sue bob dev' has more than two parts", queue="root.a"
    )


@pytest.mark.parametrize("name", ["a-b_c:d#e/f@g", "x" * 64, "A", "0"])
def test_valid_queue_names_are_accepted(name: str) -> None:
    accepted(doc(q("p", q(name))))


@pytest.mark.parametrize("name", ["a.b", "x" * 65, "", "a b", "é", "a*"])
def test_invalid_queue_names_are_refused(name: str) -> None:
    problem = refused(doc(q("p", q(name))), "queue name is not valid", queue=f"root.p.{name}")
    assert problem.message == INVALID_QUEUE_NAME


def test_sibling_names_must_differ_ignoring_case() -> None:
    refused(
        doc(q("a"), q("A")), "queue A appears more than once under root (names ignore case)", queue="root.A"
    )
    refused(
        doc(q("p", q("x"), q("X"))),
        "queue X appears more than once under root.p (names ignore case)",
        queue="root.p.X",
    )


def test_the_same_name_under_different_parents_is_accepted() -> None:
    accepted(doc(q("x", q("a")), q("y", q("a")), q("a")))


# -- 1.9 / step 5: queue guaranteed and max ------------------------------------------------------------


def test_guaranteed_above_its_own_max_is_refused() -> None:
    refused(
        doc(q("a", resources=res({"memory": 200, "vcore": 1}, {"memory": 100}))),
        "guaranteed (memory 200, vcore 1) is more than max (memory 100)",
        queue="root.a",
    )


def test_guaranteed_up_to_its_max_or_of_types_the_max_lacks_is_accepted() -> None:
    accepted(doc(q("a", resources=res({"memory": 100, "vcore": 50}, {"memory": 100}))))


def test_a_child_max_above_the_effective_parent_max_is_refused_through_a_middle_queue() -> None:
    source = doc(
        q("a", q("b", q("c", resources=res(None, {"memory": 200}))), resources=res(None, {"memory": 100}))
    )
    refused(
        source,
        "max (memory 200) is more than the max above it (memory 100)",
        queue="root.a.b.c",
    )


def test_the_effective_parent_max_is_the_smallest_of_every_ancestor() -> None:
    source = doc(
        q(
            "a",
            q(
                "b",
                q("c", resources=res(None, {"memory": 80, "vcore": 3})),
                resources=res(None, {"vcore": 2}),
            ),
            resources=res(None, {"memory": 100}),
        )
    )
    refused(
        source,
        "max (memory 80, vcore 3) is more than the max above it (memory 100, vcore 2)",
        queue="root.a.b.c",
    )


def test_a_child_max_within_the_parent_max_or_of_other_types_is_accepted() -> None:
    accepted(
        doc(
            q(
                "a",
                q("b", q("c", resources=res(None, {"memory": 100, "vcore": 9}))),
                resources=res(None, {"memory": 100}),
            )
        )
    )


def test_an_all_zero_max_is_a_valid_max_of_zero() -> None:
    accepted(doc(q("a", resources=res(None, {"memory": 0, "vcore": 0}))))
    refused(
        doc(
            q("a", q("b", resources=res(None, {"memory": 1})), resources=res(None, {"memory": 0, "vcore": 0}))
        ),
        "max (memory 1) is more than the max above it (memory 0, vcore 0)",
        queue="root.a.b",
    )
    refused(
        doc(q("a", resources=res({"memory": 1}, {"memory": 0}))),
        "guaranteed (memory 1) is more than max (memory 0)",
        queue="root.a",
    )


def test_children_guaranteed_above_the_parent_guaranteed_is_refused() -> None:
    source = doc(
        q(
            "a",
            q("x", resources=res({"memory": 60})),
            q("y", resources=res({"memory": 60})),
            resources=res({"memory": 100}),
        )
    )
    refused(
        source,
        "guaranteed (memory 100) is less than what the child queues are guaranteed together (memory 120)",
        queue="root.a",
    )


def test_a_child_without_guaranteed_counts_with_its_children() -> None:
    source = doc(
        q(
            "a",
            q("b", q("c", resources=res({"memory": 70})), q("d", resources=res({"memory": 70}))),
            resources=res({"memory": 100}),
        )
    )
    refused(source, "what the child queues are guaranteed together (memory 140)", queue="root.a")


def test_children_guaranteed_within_the_parent_guaranteed_is_accepted() -> None:
    accepted(
        doc(
            q(
                "a",
                q("x", resources=res({"memory": 50, "vcore": 100})),
                q("y", resources=res({"memory": 50})),
                resources=res({"memory": 100}),
            )
        )
    )


def test_children_guaranteed_above_the_effective_max_is_refused() -> None:
    source = doc(
        q(
            "a",
            q("b", q("c", resources=res({"memory": 60})), q("d", resources=res({"memory": 60}))),
            resources=res(None, {"memory": 100}),
        )
    )
    found = problems(source)
    assert [(p.queue, p.message) for p in found] == [
        (
            "root.a.b",
            "max (memory 100) is less than what the child queues are guaranteed together (memory 120)",
        ),
        (
            "root.a",
            "max (memory 100) is less than what the child queues are guaranteed together (memory 120)",
        ),
    ]


def test_the_sum_of_children_max_may_exceed_the_parent_max() -> None:
    accepted(
        doc(
            q(
                "a",
                q("x", resources=res({"memory": 40}, {"memory": 100})),
                q("y", resources=res({"memory": 40}, {"memory": 100})),
                resources=res({"memory": 80}, {"memory": 100}),
            )
        )
    )


def test_a_queue_max_that_does_not_parse_is_reported_once_and_then_unset() -> None:
    source = doc(
        q(
            "a",
            q("b", resources=res(None, {"memory": 1000})),
            resources=res({"vcore": "1x"}, {"memory": "1.5G"}),
        )
    )
    found = problems(source)
    assert [(p.queue, p.message) for p in found] == [
        (
            "root.a",
            f"vcore: '1x' {AMOUNT} {SUFFIXES} (vcore also takes m, for milli-cores)",
        ),
        (
            "root.a",
            f"memory: '1.5G' {AMOUNT} {SUFFIXES}",
        ),
    ]


def test_a_queue_max_with_limits_that_does_not_parse_is_reported_once() -> None:
    limits = [
        lim(users=["sue"], maxresources={"memory": 10}),
        lim(users=["bob"], maxresources={"memory": 10}),
    ]
    found = problems(doc(q("a", resources=res(None, {"memory": "100m"}), limits=limits)))
    assert [(p.queue, p.message) for p in found] == [
        (
            "root.a",
            f"the queue's max is invalid: memory: '100m' {AMOUNT} {SUFFIXES}",
        ),
    ]


def test_vcore_max_takes_millicores() -> None:
    accepted(doc(q("a", resources=res({"vcore": "500m"}, {"vcore": "1"}))))
    refused(
        doc(q("a", resources=res({"vcore": "1500m"}, {"vcore": "1"}))),
        "guaranteed (vcore 1500m) is more than max (vcore 1)",
        queue="root.a",
    )


def test_applications_is_not_a_configurable_resource() -> None:
    refused(
        doc(q("a", resources=res(None, {"applications": 5}))), "counted by the ledger itself", queue="root.a"
    )


# -- placement rules ------------------------------------------------------------------------------


def test_placement_rules_need_an_identifier_name() -> None:
    accepted(
        {"partitions": [{"queues": [], "placementrules": [{"name": "tag", "value": "ns"}, {"name": "user"}]}]}
    )
    refused(
        {"partitions": [{"queues": [], "placementrules": [{"value": "ns"}]}]},
        "placement rule #0: rule name '' is not valid",
    )
    refused(
        {"partitions": [{"queues": [], "placementrules": [{"name": "no-dash"}]}]},
        "placement rule #0: rule name 'no-dash' is not valid",
    )


# -- 1.9 / step 7: queue maxapplications ------------------------------------------------------------


def test_a_child_maxapplications_above_the_parent_is_refused() -> None:
    refused(
        doc(q("a", q("b", maxapplications=10), maxapplications=5)),
        "maxapplications 10 is more than the parent queue's maxapplications 5",
        queue="root.a.b",
    )


def test_a_child_maxapplications_up_to_the_parent_is_accepted() -> None:
    accepted(doc(q("a", q("b", maxapplications=5), q("c", maxapplications=1), maxapplications=5)))
    accepted(doc(q("a", q("b", maxapplications=50))))  # the parent sets none


def test_a_child_without_maxapplications_under_a_parent_with_one_is_refused() -> None:
    message = "maxapplications must be set (1 or more): the parent queue sets maxapplications"
    refused(doc(q("a", q("b"), maxapplications=5)), message, queue="root.a.b")
    refused(doc(q("a", q("b", q("c"), maxapplications=3), maxapplications=5)), message, queue="root.a.b.c")
    refused(doc(q("a"), maxapplications=5), message, queue="root.a")
