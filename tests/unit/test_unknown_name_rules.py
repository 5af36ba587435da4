"""A limit set that names a likely typo warns; a partition with ``unknownnames: refuse``
refuses what it would warn about, and the setting is validated with the rest of the
configuration."""

from __future__ import annotations

import pytest

from quota_ledger.config import model, typos
from quota_ledger.config.rules import PartitionRules, compile_config
from quota_ledger.config.validate import validate
from quota_ledger.model.errors import InvalidRequest, UnknownQueue, UnknownResource

CONFIG = """
partitions:
  - name: default
    {setting}
    queues:
      - name: root
        queues:
          - name: dev
            resources: {{max: {{nvidia.com/gpu: 4, vcore: 8}}}}
          - name: prod
"""


def _rules(setting: str = "") -> PartitionRules:
    config = model.normalize(model.load(CONFIG.format(setting=setting)))
    return compile_config(config, {}, 1).partition("default")


def test_a_limit_on_a_resource_close_to_a_limited_one_warns_like_a_reservation() -> None:
    said = typos.in_limits(_rules(), "root.dev", {"vcores": 10}).warnings()
    assert said == ("`vcores` is not limited anywhere in partition default; did you mean `vcore`?",)


def test_a_limit_on_a_new_resource_close_to_none_or_a_removal_warns_nothing() -> None:
    rules = _rules()
    assert typos.in_limits(rules, "root.dev", {"ephemeral-storage": 10}).warnings() == ()
    assert typos.in_limits(rules, "root.dev", {"vcores": None}).warnings() == ()
    assert typos.in_limits(rules, "root.dev", {"vcore": 4, "nvidia.com/gpu": 1}).warnings() == ()


def test_a_limit_on_a_new_queue_close_to_a_configured_sibling_warns() -> None:
    rules = _rules()
    said = typos.in_limits(rules, "root.dve", {"vcore": 1}).warnings()
    assert said == ("`root.dve` is a new queue; did you mean `root.dev`?",)
    assert typos.in_limits(rules, "root.analytics", {"vcore": 1}).warnings() == ()
    assert typos.in_limits(rules, "root.dev.new", {"vcore": 1}).warnings() == ()


def test_the_setting_is_read_from_the_partition_and_defaults_to_warn() -> None:
    assert not _rules().refuses_unknown_names
    assert not _rules("unknownnames: warn").refuses_unknown_names
    assert _rules("unknownnames: refuse").refuses_unknown_names


def test_a_refusal_names_the_unknown_resources_and_their_closest_known_names() -> None:
    refused = typos.in_request(_rules(), "root.dev", {"gpus": 1, "vcore": 1}).refusal()
    assert isinstance(refused, UnknownResource)
    assert isinstance(refused, InvalidRequest)
    assert refused.resources == ["gpus"]
    assert refused.suggestions == {"gpus": "nvidia.com/gpu"}
    assert refused.partition == "default"
    assert refused.field == "resources"
    assert "did you mean `nvidia.com/gpu`?" in str(refused)


def test_an_unknown_queue_is_refused_before_its_resources() -> None:
    refused = typos.in_request(_rules(), "root.nope", {"gpus": 1}).refusal()
    assert isinstance(refused, UnknownQueue)
    assert (refused.queue, refused.suggestion, refused.field) == ("root.nope", "root.dev", "queue")
    assert typos.in_request(_rules(), "root.dev", {"vcore": 1}).refusal() is None


@pytest.mark.parametrize("value", ["Refuse", "deny", "strict"])
def test_an_unknown_setting_is_a_problem_of_its_partition(value: str) -> None:
    problems = validate(model.load(CONFIG.format(setting=f"unknownnames: {value}")))
    assert [(p.partition, p.message) for p in problems] == [
        ("default", f"unknownnames {value!r} is not known: use warn or refuse")
    ]


def test_the_setting_survives_normalize_and_dump() -> None:
    config = model.normalize(model.load(CONFIG.format(setting="unknownnames: refuse")))
    assert model.dump(config)["partitions"][0]["unknownnames"] == "refuse"
    assert (
        "unknownnames"
        not in model.dump(model.normalize(model.load(CONFIG.format(setting=""))))["partitions"][0]
    )


def test_the_errors_and_values_are_exported_from_the_package() -> None:
    import quota_ledger

    assert quota_ledger.UnknownResource is UnknownResource
    assert quota_ledger.UnknownQueue is UnknownQueue
    assert {"IdleCounter", "LimitsVersion", "UnknownQueue", "UnknownResource"} <= set(quota_ledger.__all__)
    version = quota_ledger.LimitsVersion(3, ("w",))
    assert (version, version + 1, version.warnings) == (3, 4, ("w",))
