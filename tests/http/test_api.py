"""The HTTP API through a real uvicorn server on PostgreSQL: flows, errors, request limits."""

from __future__ import annotations

import time
from typing import Any

from http_support import Service

QUEUES_YAML = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: a
            resources: {max: {vcore: 4, memory: 8Gi}}
            limits:
              - {users: ["*"], maxresources: {vcore: 2}}
"""


def test_reserve_commit_release_flow_with_idempotency_key(service: Service) -> None:
    with service.client("admin") as admin:
        assert admin.put(
            "/v1/config", content=QUEUES_YAML, headers={"Content-Type": "application/yaml"}
        ).json() == {"version": 1}
    with service.client("service") as api:
        body = {"queue": "root.a", "resources": {"vcore": "1", "memory": "1Gi"}, "user": "sue", "ttl": 60}
        first = api.post("/v1/reservations", json=body, headers={"Idempotency-Key": "req-1"})
        assert first.status_code == 201, first.text
        again = api.post("/v1/reservations", json=body, headers={"Idempotency-Key": "req-1"})
        assert again.json()["id"] == first.json()["id"]
        conflict = api.post(
            "/v1/reservations",
            json=body | {"resources": {"vcore": "2"}},
            headers={"Idempotency-Key": "req-1"},
        )
        assert conflict.status_code == 409
        assert conflict.json()["error"]["code"] == "idempotency_conflict"
        rid = first.json()["id"]
        committed = api.post(f"/v1/reservations/{rid}/commit")
        assert committed.json()["state"] == "committed"
        assert committed.json()["committed"] == {"memory": 2**30, "vcore": 1000}
        usage = api.get("/v1/queues/root.a/usage").json()
        assert usage["vcore"] == {"in_use": 1000, "reserved": 0, "limit": 4000, "available": 3000}
        released = api.post(
            "/v1/releases",
            json={"queue": "root.a", "resources": {"vcore": "1", "memory": "1Gi"}, "user": "sue"},
        )
        assert released.status_code == 204
        assert api.get("/v1/queues/root.a/usage").json()["vcore"]["in_use"] == 0


def test_over_quota_is_409_with_every_violation(service: Service) -> None:
    with service.client("admin") as admin:
        admin.put("/v1/config", content=QUEUES_YAML, headers={"Content-Type": "application/yaml"})
    with service.client("service") as api:
        refused = api.post(
            "/v1/reservations", json={"queue": "root.a", "resources": {"vcore": "5"}, "user": "bob"}
        )
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "over_quota"
        kinds = {(v["kind"], v["scope"], v["resource"]) for v in error["details"]["violations"]}
        assert kinds == {("queue", "root.a", "vcore"), ("user", "root.a", "vcore")}


def test_errors_are_json_with_stable_codes_and_no_internals(service: Service) -> None:
    with service.client("service") as api:
        missing = api.get("/v1/reservations/00000000-0000-0000-0000-000000000000")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        bad = api.post("/v1/reservations", json={"queue": "root.a", "resources": {"memory": "12Q"}})
        assert bad.status_code == 422
        assert bad.json()["error"]["code"] == "invalid_quantity"
        assert bad.json()["error"]["details"]["field"] == "memory"
        malformed = api.post(
            "/v1/reservations", json={"queue": "root.a", "resources": {"x": 1}, "colour": "red"}
        )
        assert malformed.status_code == 422
        assert malformed.json()["error"]["details"]["field"] == "colour"
        queue = api.post("/v1/reservations", json={"queue": "not a queue", "resources": {}})
        assert queue.status_code == 422
        for response in (missing, bad, malformed, queue):
            assert "Traceback" not in response.text
            assert "SELECT" not in response.text
        made = api.post("/v1/reservations", json={"queue": "root.b", "resources": {"fpga": 1}}).json()
        api.post(f"/v1/reservations/{made['id']}/rollback")
        state = api.post(f"/v1/reservations/{made['id']}/commit")
        assert state.status_code == 409
        assert state.json()["error"]["code"] == "invalid_state"


def test_bodies_over_one_mebibyte_are_refused(service: Service) -> None:
    with service.client("service") as api:
        huge = api.post(
            "/v1/reservations",
            content=b"{" + b" " * (1024 * 1024 + 10) + b"}",
            headers={"Content-Type": "application/json"},
        )
        assert huge.status_code == 413
        assert huge.json()["error"]["code"] == "too_large"


def test_config_validate_get_and_limits(service: Service) -> None:
    with service.client("admin") as admin:
        checked = admin.post(
            "/v1/config/validate",
            content="partitions: [{name: default, queues: [{name: root, resources: {max: {vcore: 1}}}]}]",
            headers={"Content-Type": "application/yaml"},
        )
        assert checked.json()["allowed"] is False
        assert checked.json()["problems"][0]["queue"] == "root"
        refused = admin.put(
            "/v1/config",
            json={
                "partitions": [{"name": "default", "queues": [{"name": "root", "resources": {"max": {}}}]}]
            },
        )
        assert refused.status_code == 422
        assert refused.json()["error"]["code"] == "invalid_config"
        assert admin.put("/v1/queues/root.x/limits", json={"resources": {"fpga": 3}}).json() == {
            "version": 1,
            "warnings": [],
        }
        config = admin.get("/v1/config").json()
        assert config["version"] == 1
        assert config["config"]["partitions"][0]["queues"][0]["queues"][0]["name"] == "x"


def _pod(uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": uid, "namespace": "team", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "250m"}}}]},
    }


def test_pods_and_resource_quotas(service: Service) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q", "namespace": "team"},
        "spec": {"hard": {"pods": "1"}},
    }
    with service.client("admin") as admin:
        assert admin.put("/v1/resourcequotas/team/q", json=quota).json()["used"] == {"pods": "0"}
        made = admin.post("/v1/reservations", json={"pod": _pod("u1")})
        assert made.status_code == 201
        assert made.json()["queue"] == "root.team"
        over = admin.post("/v1/reservations", json={"pod": _pod("u2")})
        assert over.json()["error"]["details"]["violations"][0]["scope"] == "team/q"
        assert admin.get("/v1/resourcequotas/team/q").json() == {"hard": {"pods": "1"}, "used": {"pods": "1"}}
        admin.post(f"/v1/reservations/{made.json()['id']}/commit")
        assert admin.post(f"/v1/reservations/{made.json()['id']}/release").json()["released_at"]
        assert admin.get("/v1/resourcequotas/team/q").json()["used"] == {"pods": "0"}
        assert admin.delete("/v1/resourcequotas/team/q").status_code == 204
        assert admin.get("/v1/resourcequotas/team/q").status_code == 404


def test_the_sweeper_runs_in_the_background(service: Service) -> None:
    with service.client("service") as api:
        made = api.post(
            "/v1/reservations", json={"queue": "root.a", "resources": {"fpga": 1}, "ttl": 0.1}
        ).json()
        deadline = time.monotonic() + 10
        while api.get(f"/v1/reservations/{made['id']}").json()["state"] != "expired":
            assert time.monotonic() < deadline, "the sweeper did not expire the reservation"
            time.sleep(0.1)


def test_health_readiness_metrics_and_audit(service: Service) -> None:
    with service.client(None) as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        ready = anonymous.get("/readyz").json()
        assert ready["status"] == "ready"
    with service.client("service") as api:
        api.post("/v1/reservations", json={"queue": "root.a", "resources": {"fpga": 1}})
        api.post("/v1/reservations", json={"queue": "root.a", "resources": {"applications": 1}})
    with service.client("reader") as reader:
        text = reader.get("/metrics").text
        assert 'quota_ledger_operations_total{operation="reserve",outcome="ok"} 1.0' in text
        assert "quota_ledger_pending_reservations" in text
        assert "quota_ledger_operation_seconds_bucket" in text
        assert reader.post("/v1/audit").json() == []
        assert reader.post("/v1/audit", params={"fix": "true"}).status_code == 403
    with service.client("admin") as admin:
        assert admin.post("/v1/audit", params={"fix": "true"}).json() == []


def test_a_request_that_cannot_be_read_says_what_is_wrong(service: Service) -> None:
    with service.client("service") as api:
        ttl = api.post("/v1/reservations", json={"queue": "root.a", "resources": {"fpga": 1}, "ttl": -5})
        assert ttl.status_code == 422
        assert ttl.json()["error"]["message"].endswith("not -5")
        no_queue = api.post("/v1/reservations", json={"resources": {"fpga": 1}})
        assert no_queue.status_code == 422
        assert no_queue.json()["error"]["code"] == "invalid_request"
        assert no_queue.json()["error"]["details"]["field"] == "queue"
        broken = api.post(
            "/v1/reservations",
            content=b'{"queue": "root.a",\n "resources": {fpga: 1}}',
            headers={"Content-Type": "application/json"},
        )
        assert broken.status_code == 422
        error = broken.json()["error"]
        assert error["code"] == "invalid_request"
        assert error["details"]["field"] == "body"
        assert "line 2, column 16" in error["message"]
        form = api.post("/v1/reservations", data={"queue": "root.a"})
        assert form.status_code == 422
        assert form.json()["error"]["code"] == "invalid_request"
        assert "send Content-Type: application/json" in form.json()["error"]["message"]


def test_a_reservation_naming_an_unknown_resource_warns_in_body_and_header(service: Service) -> None:
    with service.client("admin") as api:
        yaml_body = {"Content-Type": "application/yaml"}
        assert api.put("/v1/config", content=QUEUES_YAML, headers=yaml_body).is_success
        typo = api.post("/v1/reservations", json={"queue": "root.a", "resources": {"vcores": 1}})
        assert typo.status_code == 201
        expected = "`vcores` is not limited anywhere in partition default; did you mean `vcore`?"
        assert typo.json()["warnings"] == [expected]
        assert typo.headers["Warning"] == f'299 - "{expected}"'
        fine = api.post("/v1/reservations", json={"queue": "root.a", "resources": {"vcore": 1}})
        assert fine.json()["warnings"] == []
        assert "Warning" not in fine.headers
        fraction = api.post("/v1/reservations", json={"queue": "root.a", "resources": {"vcore": "0.0001"}})
        assert fraction.status_code == 422
        assert fraction.json()["error"]["code"] == "invalid_quantity"
        whole = api.post("/v1/reservations", json={"queue": "root.a", "resources": {"fpga": "1.5"}})
        assert whole.status_code == 422
        assert "whole units" in whole.json()["error"]["message"]
