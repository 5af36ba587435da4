"""Warnings for a request that names what no configuration knows (a likely typo)."""

from __future__ import annotations

from quota_ledger.config import model, typos
from quota_ledger.config.rules import compile_config

CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            resources: {max: {nvidia.com/gpu: 4, vcore: 8}}
          - name: web
            queues:
              - name: shop
"""


def _rules() -> typos.PartitionRules:
    config = model.normalize(model.load(CONFIG))
    return compile_config(config, {}, 1).partition("default")


def test_a_resource_limited_nowhere_is_named_with_the_closest_limited_one() -> None:
    said = typos.warnings(_rules(), "root.dev", {"gpus": 1})
    assert said == ("`gpus` is not limited anywhere in partition default; did you mean `nvidia.com/gpu`?",)
    assert typos.warnings(_rules(), "root.dev", {"vcores": 1})[0].endswith("did you mean `vcore`?")


def test_a_queue_outside_every_configured_subtree_is_named_with_the_closest_queue() -> None:
    said = typos.warnings(_rules(), "root.dve", {"vcore": 1})
    assert said == ("`root.dve` is a new queue with no limits; did you mean `root.dev`?",)


def test_known_names_and_queues_below_configured_ones_warn_nothing() -> None:
    rules = _rules()
    assert typos.warnings(rules, "root.dev", {"vcore": 1, "nvidia.com/gpu": 1}) == ()
    assert typos.warnings(rules, "root.web.shop.cart", {"vcore": 1}) == ()
    assert typos.warnings(rules, "root.web.new", {"vcore": 1}) == ()


def test_a_partition_that_limits_nothing_warns_nothing() -> None:
    empty = compile_config(model.normalize(model.load("partitions: []")), {}, 1).partition("default")
    assert typos.warnings(empty, "root.anything", {"whatever": 1}) == ()
