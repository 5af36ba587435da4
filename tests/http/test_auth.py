"""Every endpoint x no token, a bad token and each role; token restrictions; token storage."""

from __future__ import annotations

from typing import Any

import pytest
from http_support import Service
from sqlalchemy import text

from quota_ledger.runtime import tokens

ZERO_ID = "00000000-0000-0000-0000-000000000000"
QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "q", "namespace": "ns"},
    "spec": {"hard": {"pods": "1"}},
}
#: (method, path, body, lowest role that may call it)
ENDPOINTS: list[tuple[str, str, Any, str]] = [
    ("GET", "/openapi.json", None, "reader"),
    ("GET", "/docs", None, "reader"),
    ("GET", "/metrics", None, "reader"),
    ("GET", "/v1/reservations?key=nope", None, "reader"),
    ("GET", "/v1/limits", None, "reader"),
    ("GET", "/v1/applications/app-1/summary", None, "reader"),
    ("PUT", "/v1/namespaces/team", {"kind": "Namespace", "metadata": {"name": "team"}}, "admin"),
    ("GET", "/ui", None, "reader"),
    ("POST", "/v1/reservations", {"queue": "root.a", "resources": {"fpga": 1}}, "service"),
    ("GET", f"/v1/reservations/{ZERO_ID}", None, "reader"),
    ("POST", f"/v1/reservations/{ZERO_ID}/commit", None, "service"),
    ("POST", f"/v1/reservations/{ZERO_ID}/rollback", None, "service"),
    ("POST", f"/v1/reservations/{ZERO_ID}/release", None, "service"),
    ("POST", "/v1/releases", {"queue": "root.a", "resources": {"fpga": 1}}, "service"),
    ("POST", "/v1/batch", {"operations": [{"op": "rollback", "id": ZERO_ID}]}, "service"),
    ("GET", "/v1/queues/root.a/usage", None, "reader"),
    ("PUT", "/v1/queues/root.a/limits", {"resources": {"fpga": 1}}, "admin"),
    ("GET", "/v1/config", None, "reader"),
    ("PUT", "/v1/config", {"partitions": [{"name": "default", "queues": [{"name": "root"}]}]}, "admin"),
    (
        "POST",
        "/v1/config/validate",
        {"partitions": [{"name": "default", "queues": [{"name": "root"}]}]},
        "reader",
    ),
    (
        "POST",
        "/v1/config/diff",
        {"partitions": [{"name": "default", "queues": [{"name": "root"}]}]},
        "reader",
    ),
    ("PUT", "/v1/resourcequotas/ns/q", QUOTA, "admin"),
    ("GET", "/v1/resourcequotas/ns/q", None, "reader"),
    ("DELETE", "/v1/resourcequotas/ns/q", None, "admin"),
    ("PUT", "/v1/resourcequotas/admission", {"kind": "ResourceQuotaConfiguration"}, "admin"),
    ("POST", "/v1/audit", None, "reader"),
    ("GET", "/ws/v1/partition/default/usage/users", None, "reader"),
    ("GET", "/ws/v1/partition/default/usage/user/sue", None, "reader"),
    ("GET", "/ws/v1/partition/default/usage/groups", None, "reader"),
    ("GET", "/ws/v1/partition/default/usage/group/dev", None, "reader"),
]
ORDER = ("reader", "service", "admin")
#: pages that lead a browser without a valid token to the sign-in form, rather than answer 401
SIGN_IN_REDIRECT = {"/docs"}


def test_every_endpoint_needs_the_right_role(service: Service) -> None:
    for method, path, body, needed in ENDPOINTS:
        refused = 303 if path in SIGN_IN_REDIRECT else 401
        with service.client(None) as anonymous:
            assert anonymous.request(method, path, json=body).status_code == refused, (method, path)
        with service.client(None, Authorization="Bearer qlt_not-a-token") as forged:
            assert forged.request(method, path, json=body).status_code == refused, (method, path)
        for role in ORDER:
            with service.client(role) as client:
                status = client.request(method, path, json=body).status_code
            if ORDER.index(role) < ORDER.index(needed):
                assert status == 403, (method, path, role, status)
            else:
                assert status not in (401, 403, 500), (method, path, role, status)


def test_health_and_readiness_need_no_token(service: Service) -> None:
    with service.client(None) as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200


def test_a_token_restricted_to_a_subtree(service: Service) -> None:
    with service.client("team-a") as team:
        assert (
            team.post("/v1/reservations", json={"queue": "root.a.web", "resources": {"fpga": 1}}).status_code
            == 201
        )
        outside = team.post("/v1/reservations", json={"queue": "root.b", "resources": {"fpga": 1}})
        assert outside.status_code == 403
        assert outside.json()["error"]["code"] == "forbidden"
        assert (
            team.post(
                "/v1/reservations", json={"queue": "root.a", "resources": {"fpga": 1}, "partition": "other"}
            ).status_code
            == 403
        )
    with service.client("service") as other:
        theirs = other.post("/v1/reservations", json={"queue": "root.b", "resources": {"fpga": 1}}).json()
    with service.client("team-a") as team:
        # Outside its scope a reservation is not found, as if it did not exist.
        assert team.post(f"/v1/reservations/{theirs['id']}/rollback").status_code == 404


def test_only_hashes_are_stored_and_revoked_tokens_stop_working(service: Service) -> None:
    with service.engine.driver.engine.connect() as conn:
        stored = [row[0] for row in conn.execute(text("SELECT token_hash FROM quota_tokens"))]
    assert service.tokens["reader"] not in stored
    assert tokens.digest(service.tokens["reader"]) in stored
    tokens.revoke(service.engine, "test-reader")
    with service.client("reader") as reader:
        assert reader.get("/v1/config").status_code == 401
    with pytest.raises(tokens.TokenNotFound):
        tokens.revoke(service.engine, "test-reader")
