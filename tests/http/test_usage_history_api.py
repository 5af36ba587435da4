"""``GET /v1/usage/history``: a queue's usage over a window, as JSON, behind a reader token."""

from __future__ import annotations

from datetime import datetime, timedelta

from http_support import Service


def test_history_endpoint_returns_one_point_a_step(service: Service) -> None:
    with service.client("admin") as admin:
        admin.put("/v1/queues/root.a/limits", json={"resources": {"vcore": 8, "memory": "8Gi"}})
        made = admin.post("/v1/reservations", json={"queue": "root.a.x", "resources": {"vcore": "2"}}).json()
        admin.post(f"/v1/reservations/{made['id']}/commit")
        admin.post("/v1/reservations", json={"queue": "root.a.x", "resources": {"memory": "1Gi"}})
    with service.client("reader") as reader:
        answer = reader.get("/v1/usage/history", params={"queue": "root.a", "window": "1h"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["queue"], body["partition"], body["window"], body["step"]) == ("root.a", "default", "1h", 60)
    assert body["limits"] == {"memory": 8 * 2**30, "vcore": 8000}
    assert body["resources"] == ["memory", "vcore"]
    points = body["points"]
    assert len(points) == 61
    times = [datetime.fromisoformat(p["time"]) for p in points]
    assert times == sorted(times)
    assert times[-1] - times[0] == timedelta(hours=1)
    assert datetime.fromisoformat(body["end"]) == times[-1]
    assert points[-1]["in_use"] == {"memory": 0, "vcore": 2000}
    assert points[-1]["reserved"] == {"memory": 2**30, "vcore": 0}
    assert points[0]["in_use"] == {"memory": 0, "vcore": 0}


def test_history_endpoint_refuses_bad_windows_queues_and_tokens(service: Service) -> None:
    with service.client("reader") as reader:
        window = reader.get("/v1/usage/history", params={"queue": "root.a", "window": "2h"})
        assert window.status_code == 422
        assert window.json()["error"]["details"]["field"] == "window"
        assert "1h" in window.json()["error"]["message"]
        assert reader.get("/v1/usage/history", params={"queue": "a.b"}).status_code == 422
        assert reader.get("/v1/usage/history", params={"partition": "no such!"}).status_code == 422
        assert "/v1/usage/history" in reader.get("/openapi.json").json()["paths"]
    with service.client(None) as anonymous:
        assert anonymous.get("/v1/usage/history").status_code == 401
    with service.client("team-a") as scoped:  # restricted to root.a
        assert scoped.get("/v1/usage/history", params={"queue": "root.a.x"}).status_code == 200
        assert scoped.get("/v1/usage/history", params={"queue": "root.b"}).status_code == 403
        assert scoped.get("/v1/usage/history").status_code == 403  # root is outside root.a
