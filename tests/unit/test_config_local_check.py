"""Checking one queue's new max locally says what validating the whole configuration says.

Random valid trees (queues with guaranteed, max and user limits; tight bounds on some) each get
a random change of one queue's max; the local check (:mod:`quota_ledger.config.local_check`)
must report exactly the problems the whole ``check()`` reports of the edited document, and the
next version's replayed document, compiled rules and index must equal those built from scratch.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest

from quota_ledger.config import local_check, model, queue_max
from quota_ledger.config.queue_max import LimitChange
from quota_ledger.config.rules import compile_config, with_queue_max
from quota_ledger.ledger import configure
from quota_ledger.model import validation

RESOURCES = ("vcore", "memory", "gpu")


def _stored(document: dict[str, Any]) -> dict[str, Any]:
    """The document as a version stores it: normalized, dumped, keys sorted."""
    dumped = model.dump(model.normalize(model.load(document)))
    result: dict[str, Any] = json.loads(json.dumps(dumped, sort_keys=True))
    return result


def _queue(rng: random.Random, name: str, level: int, above: dict[str, int]) -> dict[str, Any]:
    node: dict[str, Any] = {"name": name}
    maximum = {r: rng.randint(0, above.get(r, 12)) for r in rng.sample(RESOURCES, rng.randint(0, 2))}
    guaranteed = {r: rng.randint(0, 2) for r in rng.sample(RESOURCES, rng.randint(0, 1))}
    resources = {key: value for key, value in (("max", maximum), ("guaranteed", guaranteed)) if value}
    if resources:
        node["resources"] = resources
    if rng.random() < 0.3:
        limit = {r: rng.randint(1, 6) for r in rng.sample(RESOURCES, rng.randint(1, 2))}
        node["limits"] = [{"limit": "each", "users": ["*"], "maxresources": limit}]
    effective = {**above, **{r: min(v, above.get(r, v)) for r, v in maximum.items()}}
    if level < 4:
        children = [_queue(rng, f"q{level}{i}", level + 1, effective) for i in range(rng.randint(0, 3))]
        if children:
            node["queues"] = children
    return node


def _random_case(seed: int) -> tuple[dict[str, Any], validation.Bounds, str, dict[str, int | None]] | None:
    rng = random.Random(seed)
    tops = [_queue(rng, f"t{i}", 2, {}) for i in range(rng.randint(1, 3))]
    document = _stored({"partitions": [{"name": "default", "queues": [{"name": "root", "queues": tops}]}]})
    bounds = rng.choice(
        [validation.Bounds(), validation.Bounds(resources_per_limit_set=2, resources_per_partition=3)]
    )
    if configure.check(document, bounds)[1]:
        return None  # only valid configurations are ever stored
    paths = [p for p in local_check.build(0, document).partitions["default"].queues if p != "root"]
    names = (*RESOURCES, "fpga")
    change = {r: rng.choice([None, rng.randint(0, 14)]) for r in rng.sample(names, rng.randint(1, 3))}
    return document, bounds, rng.choice(paths), change


def _full(
    document: dict[str, Any], queue: str, change: dict[str, int | None], bounds: validation.Bounds
) -> Any:
    edited = copy.deepcopy(document)
    queue_max.set_queue_max(edited, {}, "default", queue, change)
    return configure.check(edited, bounds)


def _compare(
    document: dict[str, Any], bounds: validation.Bounds, queue: str, change: dict[str, int | None]
) -> bool:
    """Assert the local check and the next version agree with the whole check; True if refused."""
    index = local_check.build(0, document)
    checked = local_check.check_max(index, "default", queue, change, bounds)
    config, problems = _full(document, queue, change, bounds)
    assert set(checked.problems) == set(problems), (queue, change)
    if problems:
        return True
    after = _stored(model.dump(config))
    assert (not checked.changes) == (after == document)
    changes = [LimitChange(1, "default", queue, r, v) for r, v in checked.changes.items()]
    replayed, _ = queue_max.replay(copy.deepcopy(document), {}, changes)
    assert json.dumps(replayed, sort_keys=True) == json.dumps(after, sort_keys=True)
    old_rules = compile_config(model.normalize(model.load(document)), {}, 0)
    new_rules = compile_config(model.normalize(model.load(after)), {}, 1)
    assert with_queue_max(old_rules, 1, "default", queue, checked.changes) == new_rules
    moved = local_check.advanced(index, 1, "default", queue, checked.changes)
    built = local_check.build(1, after)
    assert dict(moved.partitions["default"].queues) == dict(built.partitions["default"].queues)
    assert moved.partitions["default"].uses == built.partitions["default"].uses
    assert moved.values == built.values
    return False


def test_the_local_check_agrees_with_the_whole_check_on_random_trees() -> None:
    outcomes = {True: 0, False: 0}
    for seed in range(400):
        case = _random_case(seed)
        if case is not None:
            outcomes[_compare(*case)] += 1
    # both verdicts were exercised
    assert outcomes[True] >= 20, outcomes
    assert outcomes[False] >= 20, outcomes


def _chain(depth: int, **leaf: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"name": f"l{depth}", **leaf}
    for level in range(depth - 1, 0, -1):
        node = {"name": f"l{level}", "queues": [node]}
    return _stored({"partitions": [{"queues": [{"name": "root", "queues": [node]}]}]})


@pytest.mark.parametrize("depth", [28, 29, 30])
def test_a_max_too_deep_for_the_document_is_refused_by_both(depth: int) -> None:
    document = _chain(depth)
    leaf = "root." + ".".join(f"l{i}" for i in range(1, depth + 1))
    _compare(document, validation.Bounds(), leaf, {"memory": 5})


def test_a_max_that_makes_the_document_too_large_is_refused_by_both(monkeypatch: pytest.MonkeyPatch) -> None:
    document = _stored(
        {"partitions": [{"queues": [{"name": "root", "queues": [{"name": "a"}, {"name": "b"}]}]}]}
    )
    monkeypatch.setattr(
        validation, "MAX_NODES", local_check.count_values(document) + 3
    )  # resources, max, one value
    assert _compare(document, validation.Bounds(), "root.a", {"memory": 5, "vcore": 1})
    assert not _compare(document, validation.Bounds(), "root.a", {"memory": 5})


def test_a_max_below_a_grandchilds_max_is_refused_by_both() -> None:
    grandchild = {"name": "c", "resources": {"max": {"memory": "8"}}}
    document = _stored(
        {
            "partitions": [
                {
                    "queues": [
                        {
                            "name": "root",
                            "queues": [{"name": "a", "queues": [{"name": "b", "queues": [grandchild]}]}],
                        }
                    ]
                }
            ]
        }
    )
    assert _compare(document, validation.Bounds(), "root.a", {"memory": 7})
    assert not _compare(document, validation.Bounds(), "root.a", {"memory": 8})


def test_a_max_below_what_the_children_are_guaranteed_is_refused_by_both() -> None:
    children = [{"name": n, "resources": {"guaranteed": {"memory": "3"}}} for n in ("x", "y")]
    document = _stored(
        {"partitions": [{"queues": [{"name": "root", "queues": [{"name": "a", "queues": children}]}]}]}
    )
    assert _compare(document, validation.Bounds(), "root.a", {"memory": 5})
    assert not _compare(document, validation.Bounds(), "root.a", {"memory": 6})
