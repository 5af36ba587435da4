"""Keystone's unified limits as ledger queues: models, defaults, units, selection, merging."""

from __future__ import annotations

from typing import Any

import pytest

from quota_ledger.config import load, validate
from quota_ledger.config.model import MANAGED_BY
from quota_ledger.openstack import unified_limits as ks
from quota_ledger.openstack.unified_limits import (
    DomainLimit,
    EnforcementModel,
    KeystoneLimits,
    MissingRegistered,
    Project,
    ProjectLimit,
    RegisteredLimit,
    Selection,
)

NOVA = "svc-nova"
CYBORG = "svc-cyborg"
SERVICES = {NOVA: "compute", CYBORG: "accelerator"}
PROJECTS = (
    Project(id="p1", domain_id="d1"),
    Project(id="p2", domain_id="d1"),
    Project(id="p3", domain_id="d2"),
)


def _limits(model: EnforcementModel, **kw: object) -> KeystoneLimits:
    base: dict[str, object] = {
        "model": model,
        "registered": (
            RegisteredLimit(service_id=NOVA, resource_name="class:VCPU", default_limit=4),
            RegisteredLimit(service_id=NOVA, resource_name="class:MEMORY_MB", default_limit=2048),
            RegisteredLimit(service_id=CYBORG, resource_name="accelerators", default_limit=-1),
        ),
        "project_limits": (
            ProjectLimit(project_id="p1", service_id=NOVA, resource_name="class:VCPU", resource_limit=8),
            ProjectLimit(project_id="p2", service_id=CYBORG, resource_name="accelerators", resource_limit=2),
        ),
        "domain_limits": (
            DomainLimit(domain_id="d1", service_id=NOVA, resource_name="class:VCPU", resource_limit=10),
        ),
        "projects": PROJECTS,
        "services": SERVICES,
    }
    base.update(kw)
    return KeystoneLimits(**base)  # type: ignore[arg-type]


def _max(queues: list[dict[str, object]]) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}

    def walk(items: list[dict[str, object]], prefix: str) -> None:
        for q in items:
            path = f"{prefix}.{q['name']}"
            found[path] = dict((q.get("resources") or {}).get("max") or {})  # type: ignore[attr-defined]
            walk(list(q.get("queues") or []), path)  # type: ignore[call-overload]

    walk(queues, "root")
    return found


def test_flat_makes_one_queue_per_project_with_defaults_and_units() -> None:
    queues = ks.owned_queues(_limits(EnforcementModel.FLAT), Selection())
    assert _max(queues) == {
        "root.p1": {"memory": "2048Mi", "vcore": "8"},
        "root.p2": {"accelerators": "2", "memory": "2048Mi", "vcore": "4"},
        "root.p3": {"memory": "2048Mi", "vcore": "4"},
    }
    assert all(q["properties"] == {MANAGED_BY: "keystone"} for q in queues)


def test_strict_two_level_caps_projects_by_their_domain() -> None:
    queues = ks.owned_queues(_limits(EnforcementModel.STRICT_TWO_LEVEL), Selection())
    found = _max(queues)
    assert found["root.d1"] == {"memory": "2048Mi", "vcore": "10"}
    assert found["root.d1.p1"] == {"memory": "2048Mi", "vcore": "8"}
    assert found["root.d2"] == {"memory": "2048Mi", "vcore": "4"}
    assert found["root.d2.p3"] == {"memory": "2048Mi", "vcore": "4"}
    capped = _limits(
        EnforcementModel.STRICT_TWO_LEVEL,
        domain_limits=(
            DomainLimit(domain_id="d1", service_id=NOVA, resource_name="class:VCPU", resource_limit=6),
        ),
    )
    assert _max(ks.owned_queues(capped, Selection()))["root.d1.p1"]["vcore"] == "6"


def test_the_mapped_configuration_validates() -> None:
    for model in EnforcementModel:
        document = ks.merged({}, ks.owned_queues(_limits(model), Selection()))
        assert validate(load(document)) == []


def test_a_resource_without_registered_limit_is_zero_or_unlimited() -> None:
    limits = _limits(
        EnforcementModel.FLAT,
        registered=(),
        project_limits=(
            ProjectLimit(project_id="p1", service_id=NOVA, resource_name="servers", resource_limit=3),
        ),
    )
    zero = _max(ks.owned_queues(limits, Selection()))
    assert zero["root.p1"] == {"servers": "3"}
    assert zero["root.p2"] == {"servers": "0"}
    free = _max(ks.owned_queues(limits, Selection(missing=MissingRegistered.UNLIMITED)))
    assert free["root.p2"] == {}


def test_service_and_region_select_the_limits() -> None:
    limits = _limits(
        EnforcementModel.FLAT,
        registered=(
            RegisteredLimit(service_id=NOVA, resource_name="servers", default_limit=5),
            RegisteredLimit(service_id=NOVA, region_id="r1", resource_name="servers", default_limit=7),
            RegisteredLimit(service_id=NOVA, region_id="r2", resource_name="servers", default_limit=9),
            RegisteredLimit(service_id=CYBORG, resource_name="accelerators", default_limit=1),
        ),
        project_limits=(),
    )
    assert _max(ks.owned_queues(limits, Selection()))["root.p1"] == {"accelerators": "1", "servers": "5"}
    nova_r1 = Selection(service_ids=frozenset({NOVA}), region_id="r1")
    assert _max(ks.owned_queues(limits, nova_r1))["root.p1"] == {"servers": "7"}


def test_two_keystone_names_on_one_ledger_resource_are_refused() -> None:
    limits = _limits(
        EnforcementModel.FLAT,
        registered=(
            RegisteredLimit(service_id=NOVA, resource_name="class:DISK_GB", default_limit=1),
            RegisteredLimit(service_id="other", resource_name="ephemeral-storage", default_limit=1),
        ),
        project_limits=(),
    )
    with pytest.raises(ks.MappingProblem, match="select one service"):
        ks.owned_queues(limits, Selection())


def test_merged_replaces_only_the_owned_queues() -> None:
    current: dict[str, Any] = {
        "partitions": [
            {
                "name": "default",
                "queues": [
                    {
                        "name": "root",
                        "queues": [
                            {"name": "local", "resources": {"max": {"vcore": "2"}}},
                            {"name": "gone", "properties": {MANAGED_BY: "keystone"}},
                        ],
                    }
                ],
            }
        ]
    }
    owned = ks.owned_queues(_limits(EnforcementModel.FLAT), Selection())
    document = ks.merged(current, owned)
    names = [q["name"] for q in document["partitions"][0]["queues"][0]["queues"]]
    assert names == ["local", "p1", "p2", "p3"]
    assert ks.owned_paths(document["partitions"][0]["queues"][0]["queues"]) == {
        "root.p1",
        "root.p2",
        "root.p3",
    }
    assert current["partitions"][0]["queues"][0]["queues"][1]["name"] == "gone"


def test_resource_names_and_amounts_for_reservations() -> None:
    assert ks.ledger_resource("compute", "class:MEMORY_MB").quantity(512) == "512Mi"
    assert ks.ledger_resource("compute", "class:VCPU").quantity(2) == "2"
    assert ks.ledger_resource("accelerator", "class:CUSTOM_FPGA").name == "class/CUSTOM_FPGA"
