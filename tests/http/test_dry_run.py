"""``POST /v1/reservations?dryRun=All``: the decision and its explanation, nothing written."""

from __future__ import annotations

from typing import Any

import pytest
from http_support import Service
from test_cli_remote import cli

from quota_ledger.runtime import tokens

CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: p
            resources: {max: {fpga: 4}}
            queues:
              - name: a
                resources: {max: {fpga: 3}}
              - name: b
"""
PATHS = [{}, {"batching": True, "token_cache_seconds": 60}]


def _try(client: Any, queue: str, fpga: int, **extra: Any) -> Any:
    body = {"queue": queue, "resources": {"fpga": fpga}, **extra}
    return client.post("/v1/reservations", params={"dryRun": "All"}, json=body)


@pytest.mark.parametrize("service", PATHS, indirect=True, ids=["alone", "fast-lane"])
def test_a_dry_run_answers_the_decision_and_writes_nothing(service: Service) -> None:
    with service.client("admin") as admin:
        assert admin.put(
            "/v1/config", content=CONFIG, headers={"Content-Type": "application/yaml"}
        ).is_success
    with service.client("service") as client:
        made = client.post(
            "/v1/reservations", json={"queue": "root.p.b", "resources": {"fpga": 2}, "user": "bob"}
        )
        assert made.status_code == 201
        before = client.get("/v1/reservations").json()
        admitted = _try(client, "root.p.a", 2)
        assert admitted.status_code == 201, admitted.text
        assert admitted.json() == {
            "admitted": True,
            "dry_run": True,
            "violations": [],
            "blockers": [],
            "ahead": None,
            "ahead_needs": {},
        }
        refused = _try(client, "root.p.a", 3, user="alice", application="app-1")
        assert refused.status_code == 409, refused.text
        found = refused.json()
        assert found["error"]["code"] == "over_quota"
        assert found["admitted"] is False
        assert found["violations"] == found["error"]["details"]["violations"]
        (blocker,) = found["blockers"]
        assert blocker["violation"]["scope"] == "root.p"
        assert blocker["violation"]["shortfall"] == 1
        assert blocker["holders"] == [
            {"kind": "user", "name": "bob", "queue": "root.p.b", "in_use": 0, "reserved": 2, "held": 2}
        ]
        # the real request gets the same answer
        real = client.post("/v1/reservations", json={"queue": "root.p.a", "resources": {"fpga": 3}})
        assert real.status_code == 409
        assert real.json()["error"]["details"]["violations"] == found["violations"]
        assert client.get("/v1/reservations").json() == before
        # only dryRun=All is a dry run
        assert _try(client, "root.p.a", 1).status_code == 201
        bad = client.post(
            "/v1/reservations",
            params={"dryRun": "Some"},
            json={"queue": "root.p.a", "resources": {"fpga": 1}},
        )
        assert bad.status_code == 422
        assert client.get("/v1/reservations").json() == before


def test_a_restricted_token_sees_no_holders_above_its_queue(service: Service) -> None:
    with service.client("admin") as admin:
        assert admin.put(
            "/v1/config", content=CONFIG, headers={"Content-Type": "application/yaml"}
        ).is_success
    service.tokens["team-pa"] = tokens.add(service.engine, "team-pa", "service", queue="root.p.a")
    with service.client("service") as other:
        assert (
            other.post(
                "/v1/reservations", json={"queue": "root.p.b", "resources": {"fpga": 2}, "user": "bob"}
            ).status_code
            == 201
        )
    with service.client("team-pa") as team:
        refused = _try(team, "root.p.a", 3)
        assert refused.status_code == 409
        (blocker,) = refused.json()["blockers"]
        assert (blocker["violation"]["in_use"], blocker["violation"]["reserved"], blocker["holders"]) == (
            None,
            None,
            [],
        )
        assert "bob" not in refused.text


def test_the_cli_over_http_dry_runs_as_the_service_does(service: Service) -> None:
    with service.client("admin") as admin:
        assert admin.put(
            "/v1/config", content=CONFIG, headers={"Content-Type": "application/yaml"}
        ).is_success
    with service.client("service") as client:
        body = {"queue": "root.p.b", "resources": {"fpga": 2}, "user": "bob"}
        assert client.post("/v1/reservations", json=body).status_code == 201
    fits = cli(service, "reserve", "root.p.a", "fpga=2", "--dry-run", role="service")
    assert (fits.returncode, fits.stdout.strip()) == (0, "would be admitted now")
    over = cli(service, "reserve", "root.p.a", "fpga=3", "--dry-run", role="service")
    assert over.returncode == 3, over.stderr
    assert over.stdout.splitlines() == [
        "would be refused: 1 limit stops it",
        "  fpga at root.p: limit 4, in use 0, reserved 2, requested 3, available 2; short by 1",
        "    largest holders:",
        "      user bob in root.p.b: 2 (in use 0, reserved 2)",
    ]
