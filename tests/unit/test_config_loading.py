"""YuniKorn queue configuration read and written back: loading YAML text, bytes, a file or a dict,
the errors loading reports and where, dumping, and normalizing (notes §1.4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from config_builders import YAML, accepted, doc, lim, q, refused

from quota_ledger.config import SchedulerConfig, dump, load, validate
from quota_ledger.config.model import Limit, normalize
from quota_ledger.model.errors import ConfigError
from quota_ledger.model.values import ConfigProblem

# -- load ---------------------------------------------------------------------------------------------


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


def test_a_valid_configuration_round_trips_and_stays_valid() -> None:
    cfg = normalize(load(YAML))
    assert validate(cfg) == []
    assert validate(load(dump(cfg))) == []
    assert isinstance(cfg, SchedulerConfig)
