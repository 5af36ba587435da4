"""The hot routes' fast lane answers exactly as the application's routes do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from http_support import Service
from starlette.responses import Response

from quota_ledger.http import fast_lane

LIMITS = {"partitions": [{"name": "default", "queues": [{"name": "root", "queues": [
    {"name": "a", "resources": {"max": {"fpga": 2}}},
    {"name": "b", "resources": {"max": {"fpga": 2}}},
]}]}]}  # fmt: skip
ZERO_ID = "00000000-0000-0000-0000-000000000000"
#: the lane takes only tokens already verified: the cache must be on
cached_tokens = pytest.mark.parametrize("service", [{"token_cache_seconds": 60.0}], indirect=True)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The status of every request the lane answered (the server runs in this process)."""
    found: list[int] = []
    answer = fast_lane._answer

    async def counted(call: Callable[[], Any], status: int) -> Response:
        response = await answer(call, status)
        found.append(response.status_code)
        return response

    monkeypatch.setattr(fast_lane, "_answer", counted)
    return found


def _pair(service: Service, role: str, path: str, body: Any = None) -> tuple[Any, Any]:
    """The same request through the lane, and through the application (a header or a body the
    lane leaves alone)."""
    with service.client(role) as api:
        api.get("/v1/limits")  # verifies the token: the cache holds it from now on
        if body is None:
            fast = api.post(path)
            slow = api.post(path, json={})
        else:
            fast = api.post(path, json=body)
            slow = api.post(path, json=body, headers={"Idempotency-Key": "via-the-application"})
    return fast, slow


@cached_tokens
def test_answers_and_errors_are_the_applications(service: Service, served: list[int]) -> None:
    with service.client("admin") as admin:
        assert admin.put("/v1/config", json=LIMITS).status_code == 200
    over, over_slow = _pair(
        service, "service", "/v1/reservations", {"queue": "root.a", "resources": {"fpga": 3}}
    )
    assert (over.status_code, over.json()) == (over_slow.status_code, over_slow.json())
    assert over.json()["error"]["code"] == "over_quota"
    outside, outside_slow = _pair(
        service, "team-a", "/v1/reservations", {"queue": "root.b", "resources": {"fpga": 1}}
    )
    assert (outside.status_code, outside.json()) == (403, outside_slow.json())
    missing, missing_slow = _pair(service, "service", f"/v1/reservations/{ZERO_ID}/commit")
    assert (missing.status_code, missing.json()) == (404, missing_slow.json())
    with service.client("service") as api:
        made = api.post("/v1/reservations", json={"queue": "root.a", "resources": {"fpga": 1}, "key": "k"})
        assert made.status_code == 201
        assert made.json() == api.get(f"/v1/reservations/{made.json()['id']}").json()
        done = api.post(f"/v1/reservations/{made.json()['id']}/commit")
        assert done.status_code == 200
        assert done.json() == api.get(f"/v1/reservations/{made.json()['id']}").json()
        refused = api.post(f"/v1/reservations/{made.json()['id']}/rollback")
        assert (refused.status_code, refused.json()["error"]["code"]) == (409, "invalid_state")
        malformed = api.post("/v1/reservations", json={"queue": "root.a", "resources": {}, "colour": "red"})
        assert malformed.json()["error"]["details"]["field"] == "colour"
        text = api.get("/metrics").text
    assert served == [409, 403, 404, 201, 200, 409]  # the malformed body went on to the application
    assert 'quota_ledger_operations_total{operation="reserve",outcome="ok"} 1.0' in text
    assert service.engine.usage("root.a")["fpga"].in_use == 1


@cached_tokens
def test_a_reader_and_an_unknown_token_go_on_to_the_application(service: Service, served: list[int]) -> None:
    with service.client("reader") as reader:
        reader.get("/v1/limits")
        refused = reader.post("/v1/reservations", json={"queue": "root.a", "resources": {"fpga": 1}})
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
    with service.client(None, Authorization="Bearer qlt_unknown") as stranger:
        assert stranger.post(f"/v1/reservations/{ZERO_ID}/rollback").status_code == 401
    assert served == []
