"""YuniKorn queue configuration: loading, normalizing and every validation rule of notes §1.4 and §1.9.

Each rule has a configuration YuniKorn accepts and one it refuses; a refusal is checked for
its partition, full queue path, limit and message (the ledger's own words, quantities as a person
writes them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quota_ledger.config import SchedulerConfig, dump, load, validate
from quota_ledger.config.amounts import SUFFIXES
from quota_ledger.config.limits_check import ONLY_WILDCARD_GROUP, Report
from quota_ledger.config.model import Limit, Partition, Queue, normalize
from quota_ledger.config.validate import INVALID_QUEUE_NAME, check_limits_structure
from quota_ledger.ledger import configure
from quota_ledger.model.errors import ConfigError
from quota_ledger.model.values import ConfigProblem

#: how every refused amount begins, before the list of suffixes
AMOUNT = "is not a valid amount: write a whole number with no sign or decimals, optionally followed by one of"

# -- builders ---------------------------------------------------------------------------------------


def q(name: str, *children: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A queue: ``q("a", q("b"), maxapplications=3)``."""
    queue: dict[str, Any] = {"name": name, **fields}
    if children:
        queue["queues"] = list(children)
    return queue


def lim(*, users: list[str] | None = None, groups: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    """A limit; without maxresources or maxapplications it gets ``maxapplications: 1``."""
    limit: dict[str, Any] = dict(fields)
    if users is not None:
        limit["users"] = users
    if groups is not None:
        limit["groups"] = groups
    if "maxresources" not in limit and "maxapplications" not in limit:
        limit["maxapplications"] = 1
    return limit


def doc(*children: dict[str, Any], **root: Any) -> dict[str, Any]:
    """One partition ``default`` whose root holds ``children``."""
    return {"partitions": [{"name": "default", "queues": [q("root", *children, **root)]}]}


def problems(source: Any) -> list[ConfigProblem]:
    return validate(load(source))


def accepted(source: Any) -> None:
    assert problems(source) == []


def refused(
    source: Any, message: str, *, queue: str = "", limit: str = "", partition: str = "default"
) -> ConfigProblem:
    """The one problem whose message contains ``message``; checks where it was found."""
    found = problems(source)
    matching = [p for p in found if message in p.message]
    assert len(matching) == 1, found
    problem = matching[0]
    assert (problem.partition, problem.queue, problem.limit) == (partition, queue, limit), problem
    return problem


# -- load ---------------------------------------------------------------------------------------------

YAML = """
partitions:
  - name: default
    placementrules:
      - name: tag
        value: namespace
        create: true
    queues:
      - name: root
        submitacl: '*'
        limits:
          - limit: everyone
            users: ["*"]
            maxresources: {memory: 100G, vcore: 10}
        queues:
          - name: a
            maxapplications: 4
            resources:
              guaranteed: {memory: 10G}
              max: {memory: 50G, vcore: 5}
            properties: {application.sort.policy: fifo, priority.offset: 10}
"""


def test_load_reads_yaml_text() -> None:
    cfg = load(YAML)
    root = cfg.partitions[0].queues[0]  # type: ignore[index]
    assert root.name == "root"
    assert root.limits[0].users == ("*",)
    assert root.limits[0].maxresources == {"memory": "100G", "vcore": "10"}
    assert root.queues[0].resources is not None
    assert root.queues[0].resources.max == {"memory": "50G", "vcore": "5"}
    assert root.queues[0].properties == {"application.sort.policy": "fifo", "priority.offset": "10"}
    assert validate(cfg) == []


def test_load_reads_bytes_a_path_and_a_dict(tmp_path: Path) -> None:
    file = tmp_path / "queues.yaml"
    file.write_text(YAML)
    assert load(file) == load(YAML) == load(YAML.encode()) == load(dump(load(YAML)))
    cfg = load(YAML)
    assert load(cfg) is cfg


def test_a_str_is_yaml_text_never_a_path(tmp_path: Path) -> None:
    file = tmp_path / "queues.yaml"
    file.write_text(YAML)
    with pytest.raises(ConfigError) as caught:
        load(str(file))
    assert "(document)" in caught.value.problems[0].message


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path / "missing.yaml")
    assert "cannot read configuration file" in caught.value.problems[0].message


def test_an_unknown_key_is_refused_with_where_it_is() -> None:
    with pytest.raises(ConfigError) as caught:
        load(doc(q("a", resourcez={"max": {"memory": 1}})))
    [problem] = caught.value.problems
    assert problem == ConfigProblem(
        partition="default",
        queue="root.a",
        limit="",
        message=(
            "partitions.0.queues.0.queues.0.resourcez: unknown key 'resourcez' (did you mean 'resources'?)"
        ),
    )


def test_an_unknown_key_in_a_limit_names_the_limit() -> None:
    with pytest.raises(ConfigError) as caught:
        load(doc(limits=[{"limit": "mine", "users": ["sue"], "maxapps": 1}]))
    [problem] = caught.value.problems
    assert (problem.partition, problem.queue, problem.limit) == ("default", "root", "mine")
    assert (
        problem.message
        == "partitions.0.queues.0.limits.0.maxapps: unknown key 'maxapps' (did you mean 'maxapplications'?)"
    )


def test_error_paths_follow_root_insertion_and_the_default_partition() -> None:
    source = {"partitions": [{"name": "", "queues": [q("a"), q("b", q("c", adminacl=5))]}]}
    with pytest.raises(ConfigError) as caught:
        load(source)
    [problem] = caught.value.problems
    assert (problem.partition, problem.queue) == ("default", "root.b.c")
    assert problem.message.startswith("partitions.0.queues.1.queues.0.adminacl: ")


def test_every_load_error_is_reported() -> None:
    with pytest.raises(ConfigError) as caught:
        load(doc(q("a", maxapplications=-1, colour="red"), q("b", parent="maybe")))
    messages = sorted(p.message for p in caught.value.problems)
    assert len(messages) == 3
    assert messages[0] == "partitions.0.queues.0.queues.0.colour: unknown key 'colour'"


@pytest.mark.parametrize(
    "value", [True, "5", 1.5, -1, 2**64, None, [1]], ids=lambda v: f"{type(v).__name__}:{v}"
)
def test_maxapplications_must_be_a_non_negative_int(value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        load(doc(q("a", maxapplications=value)))
    assert caught.value.problems[0].queue == "root.a"


def test_yaml_ints_are_quantities_but_floats_and_bools_are_not() -> None:
    cfg = load("partitions: [{queues: [{name: root, limits: [{users: [sue], maxresources: {vcore: 2}}]}]}]")
    assert cfg.partitions[0].queues[0].limits[0].maxresources == {"vcore": "2"}  # type: ignore[index]
    for bad in ("1.5", "true"):
        with pytest.raises(ConfigError) as caught:
            load(f"partitions: [{{queues: [{{name: a, resources: {{max: {{memory: {bad}}}}}}}]}}]")
        assert caught.value.problems[0].queue == "root.a"


def test_a_yaml_syntax_error_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load("partitions:\n  - name: [default\n")
    [problem] = caught.value.problems
    assert problem.message.startswith("invalid YAML at line ")
    assert (problem.partition, problem.queue) == ("", "")


@pytest.mark.parametrize(
    "source", [b"\xff\xfe\x00\xd8bad", b"partitions: \xc3\x28", "a: \x00", "x: &a {b: *a}"]
)
def test_unreadable_yaml_is_a_config_error(source: str | bytes) -> None:
    with pytest.raises(ConfigError) as caught:
        load(source)
    assert caught.value.problems[0].message.startswith("invalid YAML")


def test_a_duplicate_yaml_key_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load("partitions:\n  - name: a\n    name: b\n    queues: []\n")
    assert "found duplicate key 'name'" in caught.value.problems[0].message


@pytest.mark.parametrize("text", ["", "   \n", "# nothing\n", "~", "{}", "partitions:"])
def test_an_empty_document_is_the_default_configuration(text: str) -> None:
    cfg = load(text)
    assert cfg == SchedulerConfig(partitions=())
    assert validate(cfg) == []


@pytest.mark.parametrize("source", ["just text", "[1, 2]", "partitions: 3", {"partitions": [1]}])
def test_a_document_of_the_wrong_shape_is_refused(source: Any) -> None:
    with pytest.raises(ConfigError):
        load(source)


def test_yaml_null_lists_are_empty() -> None:
    cfg = load("partitions:\n  - queues:\n      - name: root\n        queues:\n        limits:\n")
    root = cfg.partitions[0].queues[0]  # type: ignore[index]
    assert (root.queues, root.limits) == ((), ())


def test_dump_is_plain_omits_defaults_and_loads_back() -> None:
    cfg = load(YAML)
    plain = dump(cfg)
    assert json.loads(json.dumps(plain)) == plain
    assert plain["partitions"][0]["queues"][0] == {
        "name": "root",
        "submitacl": "*",
        "limits": [{"limit": "everyone", "users": ["*"], "maxresources": {"memory": "100G", "vcore": "10"}}],
        "queues": [
            {
                "name": "a",
                "maxapplications": 4,
                "resources": {"guaranteed": {"memory": "10G"}, "max": {"memory": "50G", "vcore": "5"}},
                "properties": {"application.sort.policy": "fifo", "priority.offset": "10"},
            }
        ],
    }
    assert load(plain) == cfg
    normalized = normalize(cfg)
    assert load(dump(normalized)) == normalized


def test_dump_keeps_an_empty_resources_block() -> None:
    cfg = load(doc(q("a", resources={})))
    assert dump(cfg)["partitions"][0]["queues"][0]["queues"][0] == {"name": "a", "resources": {}}
    assert load(dump(cfg)) == cfg


# -- normalize ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "expected"), [("", "default"), ("DEFAULT", "default"), ("Prod", "Prod")])
def test_partition_names_are_normalized(name: str, expected: str) -> None:
    cfg = normalize(load({"partitions": [{"name": name, "queues": []}]}))
    assert cfg.partitions[0].name == expected


def test_root_is_inserted_over_several_top_queues_or_a_lone_non_root() -> None:
    for top in ([q("a"), q("b")], [q("a")], []):
        partition = normalize(load({"partitions": [{"queues": top}]})).partitions[0]
        assert partition.queues is not None
        [root] = partition.queues
        assert (root.name, root.parent) == ("root", True)
        assert [c.name for c in root.queues] == [t["name"] for t in top]


def test_a_lone_root_of_any_case_is_kept_as_root() -> None:
    [root] = normalize(load({"partitions": [{"queues": [q("ROOT", q("a"))]}]})).partitions[0].queues or ()
    assert (root.name, root.parent, [c.name for c in root.queues]) == ("root", True, ["a"])


def test_normalize_is_idempotent_and_keeps_a_missing_queue_list() -> None:
    cfg = load({"partitions": [{"name": "x"}, {"queues": [q("a")], "limits": [lim(users=["sue"])]}]})
    once = normalize(cfg)
    assert normalize(once) == once
    assert once.partitions[0].queues is None


def test_partition_only_limits_are_copied_onto_root() -> None:
    limits = [lim(limit="p", users=["sue"], maxapplications=2)]
    partition = normalize(load({"partitions": [{"queues": [q("a")], "limits": limits}]})).partitions[0]
    assert partition.queues is not None
    assert partition.queues[0].limits == partition.limits == (Limit.model_validate(limits[0]),)


def test_partition_only_limits_are_validated_as_root_limits() -> None:
    source = {"partitions": [{"queues": [q("a")], "limits": [lim(limit="p", users=["1sue"])]}]}
    refused(source, "user name '1sue' is not valid", queue="root", limit="p")


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


def res(guaranteed: dict[str, Any] | None = None, maximum: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if guaranteed is not None:
        out["guaranteed"] = guaranteed
    if maximum is not None:
        out["max"] = maximum
    return out


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


# -- 1.4.1: limits within one queue ----------------------------------------------------------------


def in_a(*limits: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A document whose queue ``root.a`` has ``limits``."""
    return doc(q("a", limits=list(limits), **fields))


def test_a_limit_without_users_or_groups_is_refused() -> None:
    refused(
        in_a(lim(limit="nobody", users=[], maxresources={"memory": "10"}, maxapplications=2)),
        "the limit names no user and no group",
        queue="root.a",
        limit="nobody",
    )
    accepted(in_a(lim(users=["sue"]), lim(groups=["dev"])))


@pytest.mark.parametrize(
    "name", ["sue", "_x", "sue@example.com", "bob$", "dom/user", "a:b#c", "first.last", "s-1"]
)
def test_valid_user_names_are_accepted(name: str) -> None:
    accepted(in_a(lim(users=[name])))


@pytest.mark.parametrize("name", ["1sue", "sue bob", "", "-x", "a$b", "sue*", "**"])
def test_invalid_user_names_are_refused(name: str) -> None:
    refused(
        in_a(lim(users=[name])),
        f"user name '{name}' is not valid: it must start with a letter or '_'",
        queue="root.a",
        limit=name,
    )


@pytest.mark.parametrize("name", ["dev", "_g", "dev.ops", "a:b", "team-1"])
def test_valid_group_names_are_accepted(name: str) -> None:
    accepted(in_a(lim(groups=[name])))


@pytest.mark.parametrize("name", ["dev@x", "dev$", "1dev", "a/b", "a#b", ""])
def test_invalid_group_names_are_refused(name: str) -> None:
    refused(
        in_a(lim(limit="g", groups=[name])),
        f"group name '{name}' is not valid: it must start with a letter or '_'",
        queue="root.a",
        limit="g",
    )


def test_a_user_named_twice_in_a_queue_is_refused() -> None:
    refused(
        in_a(lim(users=["sue", "sue"])),
        "user 'sue' is named by more than one limit of this queue",
        queue="root.a",
        limit="sue",
    )
    refused(
        in_a(lim(users=["sue"]), lim(limit="again", users=["sue"])),
        "user 'sue' is named by more than one limit of this queue",
        queue="root.a",
        limit="again",
    )
    refused(
        in_a(lim(users=["*"]), lim(users=["*"])),
        "user '*' is named by more than one limit of this queue",
        queue="root.a",
        limit="*",
    )


def test_a_group_named_twice_in_a_queue_is_refused() -> None:
    refused(
        in_a(lim(groups=["dev"]), lim(groups=["dev"])),
        "group 'dev' is named by more than one limit of this queue",
        queue="root.a",
        limit="dev",
    )


def test_the_same_user_in_different_queues_is_accepted() -> None:
    accepted(
        doc(
            q("a", limits=[lim(users=["sue"])]),
            q("b", limits=[lim(users=["sue"])]),
            limits=[lim(users=["sue"])],
        )
    )


def test_a_named_user_after_the_wildcard_is_refused() -> None:
    message = (
        "user 'sue' comes after the user wildcard '*': "
        "the wildcard must be the last user of the queue's limits"
    )
    refused(in_a(lim(users=["*", "sue"])), message, queue="root.a", limit="sue")
    refused(in_a(lim(users=["*"]), lim(limit="late", users=["sue"])), message, queue="root.a", limit="late")


def test_the_user_wildcard_may_share_a_list_when_it_comes_last() -> None:
    accepted(in_a(lim(users=["sue", "bob", "*"])))
    accepted(in_a(lim(users=["sue"]), lim(users=["*"])))


def test_a_named_group_after_the_wildcard_is_refused() -> None:
    refused(
        in_a(lim(groups=["dev", "*", "ops"])),
        "group 'ops' comes after the group wildcard '*'",
        queue="root.a",
        limit="ops",
    )


def test_a_lone_group_wildcard_is_refused() -> None:
    problem = refused(
        in_a(lim(limit="all", groups=["*"])),
        "the only group limit is the wildcard '*'",
        queue="root.a",
        limit="all",
    )
    assert problem.message.endswith("needs at least one limit that names a group")


def test_a_group_wildcard_before_its_named_group_is_refused_twice() -> None:
    found = problems(in_a(lim(groups=["*"]), lim(groups=["dev"])))
    assert [p.message for p in found] == [
        ONLY_WILDCARD_GROUP,
        "group 'dev' comes after the group wildcard '*': "
        "the wildcard must be the last group of the queue's limits",
    ]


def test_a_group_wildcard_after_a_named_group_is_accepted() -> None:
    accepted(in_a(lim(groups=["dev"]), lim(groups=["*"])))
    accepted(in_a(lim(groups=["dev", "*"])))


def test_all_zero_maxresources_is_refused_but_a_partial_zero_is_accepted() -> None:
    refused(
        in_a(lim(limit="z", users=["sue"], maxresources={"memory": 0, "vcore": "0"})),
        "maxresources must have at least one amount above zero and none below",
        queue="root.a",
        limit="z",
    )
    accepted(in_a(lim(users=["sue"], maxresources={"memory": 100, "vcore": 0})))


def test_a_limit_that_limits_nothing_is_refused() -> None:
    refused(
        in_a({"limit": "none", "users": ["sue"], "maxapplications": 0}),
        "the limit sets neither maxresources nor maxapplications",
        queue="root.a",
        limit="none",
    )
    accepted(in_a(lim(users=["sue"], maxapplications=0, maxresources={"memory": 1})))


def test_a_limit_maxapplications_above_the_queue_is_refused() -> None:
    refused(
        in_a(lim(limit="apps", users=["sue"], maxapplications=6), maxapplications=5),
        "maxapplications 6 is more than the queue's maxapplications 5",
        queue="root.a",
        limit="apps",
    )
    accepted(in_a(lim(users=["sue"], maxapplications=5), maxapplications=5))
    accepted(in_a(lim(users=["sue"], maxapplications=500)))


def test_limit_resources_above_the_queue_max_are_refused() -> None:
    refused(
        in_a(
            lim(limit="big", users=["sue"], maxresources={"memory": 200}),
            resources=res(None, {"memory": 100}),
        ),
        "maxresources (memory 200) is more than the queue's max (memory 100)",
        queue="root.a",
        limit="big",
    )


def test_limit_resources_of_types_the_queue_max_lacks_are_accepted() -> None:
    accepted(
        in_a(
            lim(users=["sue"], maxresources={"memory": 100, "vcore": 99}),
            resources=res(None, {"memory": 100}),
        )
    )
    accepted(in_a(lim(users=["sue"], maxresources={"memory": 10**12})))


def test_a_limit_quantity_that_does_not_parse_is_reported_alone() -> None:
    found = problems(in_a(lim(limit="bad", users=["sue"], maxresources={"memory": "10x"}, maxapplications=0)))
    assert [(p.queue, p.limit, p.message) for p in found] == [
        (
            "root.a",
            "bad",
            f"memory: '10x' {AMOUNT} {SUFFIXES}",
        )
    ]
    refused(
        in_a(lim(users=["sue"], maxresources={"applications": 3})),
        "counted by the ledger itself",
        queue="root.a",
        limit="sue",
    )


def test_a_limit_without_description_is_named_by_its_names() -> None:
    problem = refused(
        in_a({"users": ["sue"], "groups": ["dev"]}),
        "sets neither maxresources nor maxapplications",
        queue="root.a",
        limit="sue,dev",
    )
    assert problem.message == "the limit sets neither maxresources nor maxapplications"


# -- 1.4.2: limits down the hierarchy -------------------------------------------------------------


def mem(kind: str, names: list[str], memory: int, label: str = "") -> dict[str, Any]:
    """A limit of ``memory`` bytes for ``names`` (``kind`` is ``users`` or ``groups``)."""
    limit = lim(**{kind: names}, maxresources={"memory": memory})
    return {**limit, "limit": label} if label else limit


@pytest.mark.parametrize("kind", ["users", "groups"])
def test_a_limit_above_the_same_name_further_up_is_refused(kind: str) -> None:
    name, word = ("sue", "user") if kind == "users" else ("dev", "group")
    refused(
        doc(q("a", limits=[mem(kind, [name], 150)]), limits=[mem(kind, [name], 100)]),
        f"maxresources of {word} '{name}' (memory 150) is more than the limit for '{name}' on a parent queue "
        "(memory 100)",
        queue="root.a",
        limit=name,
    )
    accepted(doc(q("a", limits=[mem(kind, [name], 100)]), limits=[mem(kind, [name], 100)]))


def test_a_limit_above_the_ancestor_user_wildcard_is_refused() -> None:
    refused(
        doc(q("p", q("c", limits=[mem("users", ["sue"], 150, "mine")])), limits=[mem("users", ["*"], 100)]),
        "maxresources of user 'sue' (memory 150) is more than the user wildcard's limit on a parent queue "
        "(memory 100)",
        queue="root.p.c",
        limit="mine",
    )
    accepted(doc(q("p", q("c", limits=[mem("users", ["sue"], 50)])), limits=[mem("users", ["*"], 100)]))


def test_a_group_limit_above_the_ancestor_group_wildcard_is_refused() -> None:
    refused(
        doc(q("a", limits=[mem("groups", ["ops"], 150)]), limits=[mem("groups", ["dev", "*"], 100)]),
        "maxresources of group 'ops' (memory 150) is more than the group wildcard's limit on a parent queue",
        queue="root.a",
        limit="ops",
    )


def test_ancestor_limits_carry_through_queues_without_limits() -> None:
    refused(
        doc(q("a", q("b", q("c", limits=[mem("users", ["sue"], 150)]))), limits=[mem("users", ["sue"], 100)]),
        "maxresources of user 'sue' (memory 150) is more than the limit for 'sue' on a parent queue",
        queue="root.a.b.c",
        limit="sue",
    )


def test_ancestor_limits_carry_through_queues_limiting_other_names() -> None:
    source = doc(
        q("a", q("b", limits=[mem("users", ["sue"], 150)]), limits=[mem("users", ["bob"], 10)]),
        limits=[mem("users", ["sue"], 100)],
    )
    refused(source, "maxresources of user 'sue' (memory 150)", queue="root.a.b", limit="sue")


def test_the_smallest_ancestor_value_is_carried_down() -> None:
    source = doc(
        q(
            "a",
            q("b", limits=[mem("users", ["sue"], 80)]),
            limits=[lim(users=["sue"], maxresources={"memory": 100, "vcore": 1})],
        ),
        limits=[lim(users=["sue"], maxresources={"memory": 50})],
    )
    refused(
        source,
        "maxresources of user 'sue' (memory 80) is more than the limit for 'sue' on a parent queue "
        "(memory 50, vcore 1)",
        queue="root.a.b",
        limit="sue",
    )


def test_siblings_are_independent() -> None:
    accepted(
        doc(
            q(
                "a",
                q("x", limits=[mem("users", ["sue"], 100)]),
                q("y", limits=[mem("users", ["sue"], 100)]),
                limits=[mem("users", ["sue"], 100)],
            ),
            q("b", limits=[mem("users", ["sue"], 1000)]),
        )
    )


def test_types_the_ancestor_does_not_limit_pass() -> None:
    accepted(
        doc(
            q("a", limits=[lim(users=["sue"], maxresources={"vcore": 10})]),
            limits=[mem("users", ["sue"], 100)],
        )
    )


@pytest.mark.parametrize(("kind", "word"), [("users", "user"), ("groups", "group")])
def test_maxapplications_above_the_same_name_further_up_is_refused(kind: str, word: str) -> None:
    refused(
        doc(
            q("a", limits=[lim(**{kind: ["x"]}, maxapplications=10)]),
            limits=[lim(**{kind: ["x"]}, maxapplications=5)],
        ),
        f"maxapplications of {word} 'x' (10) is more than the limit for 'x' on a parent queue (5)",
        queue="root.a",
        limit="x",
    )
    accepted(
        doc(
            q("a", limits=[lim(**{kind: ["x"]}, maxapplications=5)]),
            limits=[lim(**{kind: ["x"]}, maxapplications=5)],
        )
    )


def test_maxapplications_above_the_ancestor_wildcard_is_refused() -> None:
    refused(
        doc(
            q("a", q("b", limits=[lim(users=["sue"], maxapplications=10)])),
            limits=[lim(users=["*"], maxapplications=5)],
        ),
        "maxapplications of user 'sue' (10) is more than the user wildcard's limit on a parent queue (5)",
        queue="root.a.b",
        limit="sue",
    )
    accepted(
        doc(
            q("a", q("b", limits=[lim(users=["sue"], maxapplications=2)])),
            limits=[lim(users=["*"], maxapplications=5)],
        )
    )


def test_a_child_limit_with_only_maxresources_under_an_ancestor_maxapplications_is_refused() -> None:
    refused(
        doc(q("a", limits=[mem("users", ["sue"], 10)]), limits=[lim(users=["sue"], maxapplications=5)]),
        "maxapplications of user 'sue' (unlimited (0)) is more than "
        "the limit for 'sue' on a parent queue (5)",
        queue="root.a",
        limit="sue",
    )
    accepted(doc(q("a", limits=[lim(users=["sue"], maxapplications=50)]), limits=[mem("users", ["sue"], 10)]))


def test_maxapplications_carry_through_queues_without_limits_and_siblings_are_independent() -> None:
    refused(
        doc(
            q("a", q("b", limits=[lim(groups=["dev"], maxapplications=9)])),
            limits=[lim(groups=["dev"], maxapplications=3)],
        ),
        "maxapplications of group 'dev' (9)",
        queue="root.a.b",
        limit="dev",
    )
    accepted(
        doc(
            q("a", limits=[lim(groups=["dev"], maxapplications=3)]),
            q("b", limits=[lim(groups=["dev"], maxapplications=3)]),
            limits=[lim(groups=["dev"], maxapplications=3)],
        )
    )


# -- everything is reported ---------------------------------------------------------------------------


def test_independent_problems_are_all_reported() -> None:
    source = {
        "partitions": [
            {
                "queues": [
                    q("a", adminacl="a b c"),
                    q("b", resources=res({"memory": 2}, {"memory": 1})),
                    q("c", limits=[lim(users=["1bad"])]),
                ]
            },
            {"name": "gpu"},
        ]
    }
    found = problems(source)
    assert [(p.partition, p.queue, p.limit) for p in found] == [
        ("default", "root.a", ""),
        ("default", "root.c", "1bad"),
        ("default", "root.b", ""),
        ("gpu", "", ""),
    ]


def test_three_independent_problems_give_three() -> None:
    source = doc(
        q("a", q("x"), maxapplications=2),
        q("b", limits=[lim(users=["sue", "sue"])]),
        q("c", resources=res(None, {"memory": "1m"})),
    )
    assert len(problems(source)) == 3


def test_a_valid_configuration_round_trips_and_stays_valid() -> None:
    cfg = normalize(load(YAML))
    assert validate(cfg) == []
    assert validate(load(dump(cfg))) == []
    assert isinstance(cfg, SchedulerConfig)


# -- what an operator reads ---------------------------------------------------------------------------


def test_an_unknown_key_suggests_the_closest_and_does_not_hide_other_problems() -> None:
    source = doc(q("a", maxapplication=3, resources=res(None, {"memory": "1.5G"})))
    _, found = configure.check(source)
    assert [(p.queue, p.message) for p in found] == [
        ("root.a", "partitions.0.queues.0.queues.0.maxapplication: unknown key 'maxapplication' "
         "(did you mean 'maxapplications'?)"),
        ("root.a", f"memory: '1.5G' {AMOUNT} {SUFFIXES}"),
    ]  # fmt: skip


def test_an_unknown_key_far_from_every_known_one_suggests_nothing() -> None:
    _, found = configure.check(doc(q("a", zzzz=1)))
    assert [p.message for p in found] == ["partitions.0.queues.0.queues.0.zzzz: unknown key 'zzzz'"]


def test_every_problem_is_reported_once() -> None:
    twice = lim(limit="same", users=["1bad"])
    _, found = configure.check(doc(q("a", limits=[twice]), q("b", limits=[twice])))
    assert len(found) == len(set(found)) == 2


@pytest.mark.parametrize("name", ["a b", "a\x01", "ä", "x'; DROP TABLE reservations; --", "p" * 65])
def test_partition_names_are_checked_as_reserve_checks_them(name: str) -> None:
    source = {"partitions": [{"name": name, "queues": []}]}
    problem = refused(source, "invalid partition name", partition=name)
    assert problem.queue == ""


def test_every_key_yunikorn_accepts_on_a_partition_is_kept() -> None:
    source = {
        "partitions": [
            {
                "name": "default",
                "queues": [{"name": "root"}],
                "usergroupresolver": {"type": "ldap"},
                "preemption": {"enabled": True, "quotapreemptionenabled": False},
                "nodesortpolicy": {"type": "binpacking", "resourceweights": {"vcore": 1.0}},
                "placementrules": [{"name": "tag", "value": "namespace", "create": True}],
                "limits": [{"limit": None, "users": ["sue"], "maxapplications": 1}],
            }
        ]
    }
    accepted(source)
    unnamed = {"users": ["sue"], "maxapplications": 1}  # a null description is "", a default
    assert dump(load(source))["partitions"][0] == {**source["partitions"][0], "limits": [unnamed]}
