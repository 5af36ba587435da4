"""Hostile input over HTTP: always a 4xx naming the problem, never a 500 or a traceback; the same
refusals as the Python API; restricted tokens learn nothing outside their scope."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from http_support import Service

POD: dict[str, Any] = {
    "metadata": {"namespace": "team", "name": "p", "uid": "u1"},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
}


def _error(response: Any, status: int = 422) -> dict[str, Any]:
    assert response.status_code == status, response.text
    found: dict[str, Any] = response.json()["error"]
    return found


def test_nul_bytes_and_surrogates_in_paths_and_bodies_are_refused(service: Service) -> None:
    with service.client("admin") as client:
        assert _error(client.get("/v1/reservations/%00"))["details"]["field"] == "id"
        assert _error(client.post("/v1/reservations/%00/commit"))["details"]["field"] == "id"
        assert client.get("/v1/reservations/%ED%A0%80").status_code in (404, 422)
        assert _error(client.get("/v1/reservations", params={"key": "a\x00"}))["details"]["field"] == "key"
        for field in ("key", "user", "application", "priority_class"):
            raw = '{"queue": "root.a", "resources": {"fpga": 1}, "' + field + '": "x\\ud800"}'
            sent = client.post("/v1/reservations", content=raw, headers={"content-type": "application/json"})
            assert _error(sent)["details"]["field"] == field
        raw = '{"queue": "root.a", "resources": {"\\ud800": 1}}'
        sent = client.post("/v1/reservations", content=raw, headers={"content-type": "application/json"})
        assert _error(sent)["details"]["field"] == "resources"
        assert "\\ud800" in sent.text  # quoted, escaped: the body is still valid JSON
        big = {"metadata": {"namespace": "team", "name": "q"}, "spec": {"hard": {"pods": "1\x00"}}}
        assert client.put("/v1/resourcequotas/team/q", json=big).status_code == 422


def test_deep_nesting_is_refused_without_a_traceback(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    deep_yaml = "partitions: " + "[" * 2000 + "]" * 2000
    deep_json = "[" * 5000 + "]" * 5000
    with caplog.at_level(logging.ERROR), service.client("reader") as reader:
        sent = reader.post(
            "/v1/config/validate", content=deep_yaml, headers={"content-type": "application/yaml"}
        )
        assert sent.status_code == 200
        assert sent.json()["allowed"] is False
        assert "deeper than" in sent.json()["problems"][0]["message"]
        sent = reader.post(
            "/v1/config/validate", content=deep_json, headers={"content-type": "application/json"}
        )
        assert sent.status_code == 422
    nested: Any = "x"
    for _ in range(500):
        nested = {"a": nested}
    with caplog.at_level(logging.ERROR), service.client("admin") as admin:
        body = {"pod": {**POD, "metadata": {**POD["metadata"], "annotations": nested}}}
        assert _error(admin.post("/v1/reservations", json=body))["details"]["field"] == "pod"
        sent = admin.post("/v1/reservations", content=deep_json, headers={"content-type": "application/json"})
        assert 400 <= sent.status_code < 500
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_admission_configuration_shapes_are_refused(service: Service) -> None:
    with service.client("admin") as admin:
        for plugins in (5, None, "x", [5]):
            body = {"kind": "AdmissionConfiguration", "plugins": plugins}
            found = _error(admin.put("/v1/resourcequotas/admission", json=body))
            assert found["code"] == "invalid_resource_quota"


def test_pod_fields_are_validated(service: Service) -> None:
    with service.client("admin") as admin:
        for spec, meta, field in (
            ({"priorityClassName": "p" * 300}, {}, "spec.priorityClassName"),
            ({"priorityClassName": "a\x00"}, {}, "spec.priorityClassName"),
            ({}, {"namespace": "x y'; --"}, "metadata.namespace"),
        ):
            pod = {"metadata": {**POD["metadata"], **meta}, "spec": {**POD["spec"], **spec}}
            assert _error(admin.post("/v1/reservations", json={"pod": pod}))["details"]["field"] == field
        assert admin.post("/v1/reservations", json={"pod": POD}).status_code == 201


def test_http_refuses_the_quantities_and_types_the_python_api_refuses(service: Service) -> None:
    with service.client("service") as client:
        for amount in (2.0, True, False, None, [1]):
            body = {"queue": "root.a", "resources": {"vcore": amount}}
            found = _error(client.post("/v1/reservations", json=body))
            assert (found["code"], found["details"]["field"]) == ("invalid_quantity", "vcore")
        for ttl in (True, "5", 0, -1):
            body = {"queue": "root.a", "resources": {"vcore": 1}, "ttl": ttl}
            assert _error(client.post("/v1/reservations", json=body))["details"]["field"] == "ttl"
        for groups in (5, [None], "devs"):
            body = {"queue": "root.a", "resources": {"vcore": 1}, "groups": groups}
            assert _error(client.post("/v1/reservations", json=body))["details"]["field"] == "groups"
        body = {"queue": "root.a", "resources": {"vcore": 1}, "terminating": 1}
        assert _error(client.post("/v1/reservations", json=body))["details"]["field"] == "terminating"
        body = {"queue": "root.a", "resources": {"vcore": 1}, "groups": None, "ttl": 30}
        assert client.post("/v1/reservations", json=body).status_code == 201


def test_too_many_resources_are_refused(service: Service) -> None:
    many = {f"r{i}": 1 for i in range(30_000)}
    with service.client("service") as client:
        found = _error(client.post("/v1/reservations", json={"queue": "root.a", "resources": many}))
        assert found["code"] == "too_many_resources"
        found = _error(client.post("/v1/releases", json={"queue": "root.a", "resources": many}))
        assert found["code"] == "too_many_resources"
    with service.engine.driver.engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT count(*) FROM quota_usages")).scalar() == 0


def test_audit_of_an_empty_partition_name_is_refused(service: Service) -> None:
    with service.client("reader") as reader:
        assert _error(reader.post("/v1/audit", params={"partition": ""}))["details"]["field"] == "partition"


def test_a_restricted_token_learns_nothing_outside_its_scope(service: Service) -> None:
    with service.client("service") as other:
        theirs = other.post(
            "/v1/reservations", json={"queue": "root.b", "resources": {"fpga": 1}, "key": "k"}
        )
        assert theirs.status_code == 201
    with service.client("team-a") as team:
        held = team.get("/v1/reservations", params={"key": "k"})
        absent = team.get("/v1/reservations", params={"key": "never-used"})
        assert held.status_code == absent.status_code == 404
        assert held.json()["error"]["code"] == absent.json()["error"]["code"]
        assert team.get(f"/v1/reservations/{theirs.json()['id']}").status_code == 404
        assert team.get("/metrics").status_code == 403
    with service.client("service") as unrestricted:
        clash = unrestricted.post(
            "/v1/reservations", json={"queue": "root.c", "resources": {"fpga": 1}, "key": "k"}
        )
        assert theirs.json()["id"] in _error(clash, 409)["message"]  # its own scope: named
    with service.client("reader") as reader:
        assert reader.get("/metrics").status_code == 200
