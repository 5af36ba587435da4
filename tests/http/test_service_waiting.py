"""Waiting for capacity through the service: ``"wait"`` in ``POST /v1/reservations`` (201 or
202), the long poll ``GET /v1/reservations/{id}?wait=``, ``GET /v1/queues/{queue}/waiting``, and
the CLI's ``reserve --wait`` and ``waiting`` against the service."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from http_support import Service
from test_cli_remote import cli, ok

CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: a
            resources: {max: {fpga: 4}}
          - name: b
"""
PATHS = [{}, {"batching": True, "token_cache_seconds": 60}]


def _configure(service: Service) -> None:
    with service.client("admin") as admin:
        answer = admin.put("/v1/config", content=CONFIG, headers={"Content-Type": "application/yaml"})
        assert answer.is_success, answer.text


def _reserve(client: Any, fpga: int, **extra: Any) -> Any:
    return client.post("/v1/reservations", json={"queue": "root.a", "resources": {"fpga": fpga}, **extra})


@pytest.mark.parametrize("service", PATHS, indirect=True, ids=["alone", "fast-lane"])
def test_a_request_that_does_not_fit_waits_and_a_long_poll_sees_its_grant(service: Service) -> None:
    _configure(service)
    with service.client("service") as client:
        holder = _reserve(client, 3)
        assert holder.status_code == 201
        granted_at_once = _reserve(client, 1, wait=30)
        assert (granted_at_once.status_code, granted_at_once.json()["state"]) == (201, "pending")
        waiting = _reserve(client, 2, wait=30, priority=4)
        assert waiting.status_code == 202, waiting.text
        body = waiting.json()
        assert (body["state"], body["position"], body["priority"]) == ("waiting", 1, 4)
        assert waiting.headers["Location"] == f"/v1/reservations/{body['id']}"
        line = client.get("/v1/queues/root.a/waiting").json()["waiting"]
        assert [(w["id"], w["position"], w["resources"]) for w in line] == [(body["id"], 1, {"fpga": 2})]
        assert client.get("/v1/queues/root.b/waiting").json() == {"waiting": []}
        still = client.get(waiting.headers["Location"], params={"wait": 0.3})
        assert still.json()["state"] == "waiting"
        timer = threading.Timer(0.3, client.post, args=(f"/v1/reservations/{holder.json()['id']}/rollback",))
        started = time.monotonic()
        timer.start()
        with service.client("service") as poller:
            polled = poller.get(waiting.headers["Location"], params={"wait": 20})
        timer.join()
        assert polled.status_code == 200
        assert (polled.json()["state"], polled.json()["position"]) == ("pending", None)
        assert time.monotonic() - started < 10
    assert service.engine.usage("root.a")["fpga"].reserved == 3


def test_wait_arguments_are_checked(service: Service) -> None:
    _configure(service)
    with service.client("service") as client:
        _reserve(client, 4)
        for extra, field in (({"wait": 0}, "wait"), ({"wait": 5, "priority": "high"}, "priority")):
            refused = _reserve(client, 1, **extra)
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"]["details"]["field"] == field
        assert _reserve(client, 1, priority=3).status_code == 422
        pod = {"metadata": {"name": "p", "namespace": "a", "uid": "u1"}, "spec": {"containers": []}}
        assert client.post("/v1/reservations", json={"pod": pod, "wait": 5}).status_code == 422
        batch = client.post(
            "/v1/batch",
            json={"operations": [{"op": "reserve", "queue": "root.a", "resources": {"fpga": 1}, "wait": 5}]},
        )
        (result,) = batch.json()["results"]
        assert (result["status"], result["body"]["error"]["details"]["field"]) == (422, "wait")
        made = _reserve(client, 1, wait=5)
        too_long = client.get(f"/v1/reservations/{made.json()['id']}", params={"wait": 61})
        assert too_long.status_code == 422
        outside = service.client("team-a")
        with outside:
            assert outside.get("/v1/queues/root.b/waiting").status_code == 403


def test_the_cli_waits_in_line_through_the_service(service: Service) -> None:
    _configure(service)
    holder = service.engine.reserve("root.a", {"fpga": 4})
    timer = threading.Timer(1.0, service.engine.rollback, args=(holder.id,))
    timer.start()
    made = json.loads(
        ok(cli(service, "reserve", "root.a", "fpga=2", "--wait", "30s", "--json", role="service"))
    )
    timer.join()
    assert made["state"] == "pending"
    service.engine.reserve("root.a", {"fpga": 2})
    waiting = service.engine.reserve("root.a", {"fpga": 3}, wait=30, block=False, priority=2)
    shown = ok(cli(service, "waiting", "root.a"))
    assert waiting.id[:8] in shown
    assert "fpga=3" in shown
    timed_out = cli(service, "reserve", "root.a", "fpga=1", "--wait", "1s", role="service")
    assert timed_out.returncode == 3, timed_out.stderr
    assert "waited in vain" in timed_out.stderr


def test_the_metrics_and_the_dashboard_show_the_lines(service: Service) -> None:
    _configure(service)
    holder = service.engine.reserve("root.a", {"fpga": 4})
    waiting = service.engine.reserve("root.a", {"fpga": 1}, wait=60, block=False)
    with service.client("admin") as admin:
        metrics = admin.get("/metrics").text
        assert 'quota_ledger_waiting_requests{partition="default",queue="root.a"} 1.0' in metrics
        assert 'quota_ledger_oldest_waiting_seconds{partition="default"}' in metrics
        page = admin.get("/ui").text
        assert "Waiting for capacity" in page
        assert "<small>1 waiting, by queue</small>" in page
        service.engine.rollback(holder.id)
        assert service.engine.wait_for(waiting.id, 10).state.value == "pending"
        metrics = admin.get("/metrics").text
        assert "quota_ledger_waiting_requests{" not in metrics
        granted = [
            line for line in metrics.splitlines() if line.startswith("quota_ledger_waiting_grants_total")
        ]
        # granted once, by the pass the rollback kicked or by the service's sweeper, if it came first
        assert granted in (
            ['quota_ledger_waiting_grants_total{reason="rollback"} 1.0'],
            ['quota_ledger_waiting_grants_total{reason="sweep"} 1.0'],
        )
        assert "quota_ledger_wait_seconds_count 1.0" in metrics
        assert "Nobody waits for capacity." in admin.get("/ui").text
