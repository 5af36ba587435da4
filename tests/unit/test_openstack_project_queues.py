"""One project's Keystone-owned queues put into a configuration document, everything else kept."""

from __future__ import annotations

from typing import Any

import pytest

from quota_ledger.config.model import MANAGED_BY
from quota_ledger.openstack.project_queues import upsert
from quota_ledger.openstack.unified_limits import KEYSTONE, MappingProblem

OWNED = {MANAGED_BY: KEYSTONE}


def owned(name: str, fpga: str, *children: dict[str, Any]) -> dict[str, Any]:
    queue: dict[str, Any] = {"name": name, "resources": {"max": {"fpga": fpga}}, "properties": dict(OWNED)}
    if children:
        queue["parent"] = True
        queue["queues"] = list(children)
    return queue


def document(*queues: dict[str, Any]) -> dict[str, Any]:
    return {"partitions": [{"name": "default", "queues": [{"name": "root", "queues": list(queues)}]}]}


def children(found: dict[str, Any]) -> list[dict[str, Any]]:
    return list(found["partitions"][0]["queues"][0]["queues"])


def test_a_new_project_is_added_after_the_queues_there() -> None:
    local = {"name": "batch", "resources": {"max": {"fpga": "1"}}}
    found = upsert(document(local, owned("p1", "5")), [owned("p2", "3")], partition="default")
    assert [q["name"] for q in children(found)] == ["batch", "p1", "p2"]
    assert children(found)[0] == local


def test_a_known_project_is_replaced_in_place() -> None:
    found = upsert(document(owned("p1", "5"), owned("p2", "3")), [owned("p1", "7")], partition="default")
    assert children(found) == [owned("p1", "7"), owned("p2", "3")]


def test_a_domain_keeps_its_other_projects() -> None:
    before = document(owned("d1", "10", owned("alpha", "8")))
    found = upsert(before, [owned("d1", "12", owned("beta", "8"))], partition="default")
    assert children(found) == [owned("d1", "12", owned("alpha", "8"), owned("beta", "8"))]


def test_a_local_queue_of_the_projects_name_is_refused() -> None:
    with pytest.raises(MappingProblem, match=r"root\.p1 is configured in the ledger"):
        upsert(document({"name": "p1"}), [owned("p1", "5")], partition="default")


def test_a_missing_partition_and_root_are_made() -> None:
    found = upsert({"partitions": []}, [owned("p1", "5")], partition="gpu")
    assert found == {
        "partitions": [{"name": "gpu", "queues": [{"name": "root", "queues": [owned("p1", "5")]}]}]
    }
