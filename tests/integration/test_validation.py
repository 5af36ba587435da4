"""Hostile and malformed input through the Python API: a typed error naming the field, and the
ledger tables unchanged, on every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ledger_dump import dump
from sqlalchemy.engine import URL

from quota_ledger import (
    ConfigError,
    InvalidQuantity,
    InvalidRequest,
    InvalidResourceQuota,
    QuotaEngine,
    QuotaLedgerError,
    ReservationNotFound,
)
from quota_ledger.model.errors import TooManyResources

HOSTILE_NAMES = ["a\x00b", "\ud800", "x\udfff", "\x00"]


@pytest.fixture
def engine(db_url: URL) -> Iterator[QuotaEngine]:
    with QuotaEngine.from_url(db_url) as made:
        made.set_limits("root.a", {"vcore": 8})
        made.reserve("root.a", {"vcore": 1}, key="k1", user="alice", groups=["g"])
        yield made


def refused(
    engine: QuotaEngine, call: Callable[[], Any], error: type[QuotaLedgerError] = InvalidRequest
) -> Any:
    """Run ``call``: it raises ``error`` and leaves every ledger table byte-for-byte unchanged."""
    before = dump(engine)
    with pytest.raises(error) as info:
        call()
    assert dump(engine) == before
    return info.value


def test_nul_bytes_and_lone_surrogates_are_invalid_requests(engine: QuotaEngine) -> None:
    for bad in HOSTILE_NAMES:
        for call in (engine.get, engine.commit, engine.rollback, engine.release_reservation):
            assert refused(engine, lambda c=call, b=bad: c(b)).field == "id"
        for field in ("key", "user", "application", "groups", "priority_class"):
            value: Any = [bad] if field == "groups" else bad
            error = refused(engine, lambda f=field, v=value: engine.reserve("root.a", {"vcore": 1}, **{f: v}))
            assert error.field == field
        _refused_everywhere(engine, bad)


def _refused_everywhere(engine: QuotaEngine, bad: str) -> None:
    assert refused(engine, lambda: engine.reserve(f"root.{bad}", {"vcore": 1})).field == "queue"
    assert refused(engine, lambda: engine.reserve("root.a", {"vcore": 1}, partition=bad)).field == "partition"
    assert refused(engine, lambda: engine.reserve("root.a", {bad: 1})).field == "resources"
    assert refused(engine, lambda: engine.reserve("root.a", {"vcore": bad}), InvalidQuantity).field == "vcore"
    assert refused(engine, lambda: engine.get_by_key(bad)).field == "key"
    assert refused(engine, lambda: engine.user_usage(bad)).field == "user"
    assert refused(engine, lambda: engine.namespace_queue(bad)).field == "namespace"
    assert refused(engine, lambda: engine.release("root.a", {"vcore": 1}, user=bad)).field == "user"


def test_an_unknown_but_well_formed_id_is_not_found(engine: QuotaEngine) -> None:
    refused(engine, lambda: engine.commit("00000000-0000-0000-0000-000000000000"), ReservationNotFound)


def test_deeply_nested_yaml_is_a_config_error() -> None:
    body = "partitions: " + "[" * 2000 + "]" * 2000
    with QuotaEngine.from_url("sqlite://") as engine:
        problems = engine.validate_config(body)
    assert len(problems) == 1
    assert "deeper than" in problems[0].message


def test_deeply_nested_documents_are_refused(engine: QuotaEngine) -> None:
    deep: Any = {}
    for _ in range(3000):
        deep = {"x": deep}
    error = refused(
        engine, lambda: engine.apply_config("partitions: " + "[" * 2000 + "]" * 2000), ConfigError
    )
    assert "deeper than" in str(error)
    refused(engine, lambda: engine.apply_config({"partitions": [deep]}), ConfigError)
    pod = {"metadata": {"namespace": "a", "annotations": deep}, "spec": {"containers": [{"name": "c"}]}}
    assert refused(engine, lambda: engine.reserve_pod(pod)).field == "pod"
    assert refused(engine, lambda: engine.apply_namespace("a: " + "[" * 5000)).field == "manifest"
    quota = {"metadata": {"name": "q", "namespace": "a"}, "spec": {"hard": {"pods": "1"}, "x": deep}}
    assert refused(engine, lambda: engine.apply_resource_quota(quota)).field == "ResourceQuota"


def test_billion_laughs_is_refused(engine: QuotaEngine) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    error = refused(engine, lambda: engine.apply_admission_config("\n".join(lines)))
    assert "values" in str(error)


def test_admission_configuration_shapes_are_checked(engine: QuotaEngine) -> None:
    for plugins in (5, None, "x", [5], [{"name": 5}]):
        manifest = {"kind": "AdmissionConfiguration", "plugins": plugins}
        error = refused(engine, lambda m=manifest: engine.apply_admission_config(m), InvalidResourceQuota)
        assert error.field.startswith("plugins")


def _pod(namespace: str = "team", name: str = "p", priority: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    if priority is not None:
        spec["priorityClassName"] = priority
    return {"metadata": {"namespace": namespace, "name": name, "uid": "u1"}, "spec": spec}


def test_pod_fields_are_validated_as_the_api_server_does(engine: QuotaEngine) -> None:
    for pod, field in [
        (_pod(priority="p" * 300), "spec.priorityClassName"),
        (_pod(priority="high\x00"), "spec.priorityClassName"),
        (_pod(priority="High"), "spec.priorityClassName"),
        (_pod(namespace="x y'; --"), "metadata.namespace"),
        (_pod(namespace="a" * 64), "metadata.namespace"),
        (_pod(namespace="Team"), "metadata.namespace"),
        (_pod(namespace="a.b"), "metadata.namespace"),
        (_pod(name="a" * 254), "metadata.name"),
        (_pod(name="a_b"), "metadata.name"),
        (_pod(name="\x00"), "metadata.name"),
    ]:
        assert refused(engine, lambda pod=pod: engine.reserve_pod(pod)).field == field


def test_valid_kubernetes_names_at_their_limits_are_taken(engine: QuotaEngine) -> None:
    made = engine.reserve_pod(_pod(namespace="a" * 63, name="b" * 253, priority="c." * 126 + "c"))
    assert made.queue == "root." + "a" * 63
    assert made.priority_class == "c." * 126 + "c"


def test_priority_class_of_the_python_api_is_a_dns_subdomain(engine: QuotaEngine) -> None:
    error = refused(engine, lambda: engine.reserve("root.a", {"vcore": 1}, priority_class="p" * 300))
    assert error.field == "priority_class"


def test_groups_none_means_no_groups(engine: QuotaEngine) -> None:
    made = engine.reserve("root.a", {"vcore": 1}, groups=None)
    assert made.groups == ()
    engine.release("root.a", {}, groups=None)


def test_arguments_of_the_wrong_type_are_refused(engine: QuotaEngine) -> None:
    for groups in (5, [None], "devs", [1], {"a": 1}, ["g"] * 257):
        for call in (engine.reserve, engine.release):
            error = refused(engine, lambda c=call, g=groups: c("root.a", {"vcore": 1}, groups=g))
            assert error.field == "groups"
    for amount in (2.0, True, False, None, [1]):
        error = refused(engine, lambda a=amount: engine.reserve("root.a", {"vcore": a}), InvalidQuantity)
        assert error.field == "vcore"
    for ttl in (True, False, "5", 0, -1, float("nan"), float("inf"), 10**400):
        assert refused(engine, lambda t=ttl: engine.reserve("root.a", {"vcore": 1}, ttl=t)).field == "ttl"
    for flag in ("terminating", "cross_namespace_affinity"):
        error = refused(engine, lambda f=flag: engine.reserve("root.a", {"vcore": 1}, **{f: 1}))
        assert error.field == flag


def test_audit_of_an_empty_partition_name_is_refused(engine: QuotaEngine) -> None:
    assert refused(engine, lambda: engine.audit(partition="")).field == "partition"
    assert engine.audit(partition="default") == []


def test_the_number_of_resources_a_request_names_is_bounded(db_url: URL) -> None:
    with QuotaEngine.from_url(db_url, max_resources_per_request=3, max_resources_per_limit_set=2) as engine:
        many = {f"r{i}": 1 for i in range(4)}
        error = refused(engine, lambda: engine.reserve("root.a", many), TooManyResources)
        assert (error.count, error.maximum, error.field) == (4, 3, "resources")
        refused(engine, lambda: engine.release("root.a", many), TooManyResources)
        refused(engine, lambda: engine.set_limits("root.a", {"a": 1, "b": 1, "c": 1}), TooManyResources)
        three = engine.reserve("root.a", {"r0": 1, "r1": 1, "r2": 1})
        refused(engine, lambda: engine.commit(three.id, many), TooManyResources)
        yaml = (
            "partitions: [{name: default, queues: [{name: root,"
            " queues: [{name: b, resources: {max: {a: 1, b: 1, c: 1}}}]}]}]"
        )
        problems = engine.validate_config(yaml)
        assert [p.queue for p in problems] == ["root.b"]
        refused(engine, lambda: engine.apply_config(yaml), ConfigError)


def test_the_default_bound_refuses_thirty_thousand_resources(engine: QuotaEngine) -> None:
    many = {f"r{i}": 1 for i in range(30_000)}
    error = refused(engine, lambda: engine.reserve("root.a", many), TooManyResources)
    assert error.maximum == 64


def test_the_number_of_resources_a_partition_names_is_bounded(db_url: URL) -> None:
    with QuotaEngine.from_url(db_url, max_resources_per_partition=3) as engine:
        engine.reserve("root.a", {"a": 1, "b": 1})
        engine.reserve("root.b", {"a": 1, "c": 1})  # new counters, but still three names
        error = refused(engine, lambda: engine.reserve("root.c", {"d": 1}), TooManyResources)
        assert "partition 'default'" in str(error)
        engine.reserve("root.a", {"a": 1}, partition="other")  # another partition counts on its own


def test_bounds_must_be_positive_integers(db_url: URL) -> None:
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InvalidRequest) as info:
            QuotaEngine.from_url(db_url, max_resources_per_request=bad)
        assert info.value.field == "max_resources_per_request"
