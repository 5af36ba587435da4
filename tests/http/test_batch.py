"""POST /v1/batch: each operation decided as its own request would be, results in order."""

from __future__ import annotations

from typing import Any

from http_support import Service

from quota_ledger.http import batch

LIMITS = {"partitions": [{"name": "default", "queues": [{"name": "root", "queues": [
    {"name": "a", "resources": {"max": {"fpga": 4}}},
    {"name": "b", "resources": {"max": {"fpga": 4}}},
]}]}]}  # fmt: skip
ZERO_ID = "00000000-0000-0000-0000-000000000000"


def _configure(service: Service) -> None:
    with service.client("admin") as admin:
        assert admin.put("/v1/config", json=LIMITS).status_code == 200


def _batch(service: Service, role: str, operations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    with service.client(role) as api:
        answer = api.post("/v1/batch", json={"operations": operations})
    assert answer.status_code == 200, answer.text
    results: list[dict[str, Any]] = answer.json()["results"]
    assert len(results) == len(operations)
    return results


def test_successes_and_failures_of_one_batch_come_back_in_order(service: Service) -> None:
    _configure(service)
    results = _batch(
        service,
        "service",
        [
            {"op": "reserve", "queue": "root.a", "resources": {"fpga": 1}, "key": "k-1"},
            {"op": "reserve", "queue": "root.a", "resources": {"fpga": 9}},
            {"op": "reserve", "queue": "root.a", "resources": {"fpga": 1}, "colour": "red"},
            {"op": "reserve", "queue": "root.a", "resources": {"memory": "12Q"}},
            {"op": "commit", "id": ZERO_ID},
            {"op": "rollback"},
            {"op": "release", "id": ZERO_ID},
        ],
    )
    assert [r["status"] for r in results] == [201, 409, 422, 422, 404, 422, 422]
    made = results[0]["body"]
    assert (made["queue"], made["state"], made["resources"], made["key"]) == (
        "root.a",
        "pending",
        {"fpga": 1},
        "k-1",
    )
    assert results[1]["body"]["error"]["code"] == "over_quota"
    assert results[1]["body"]["error"]["details"]["violations"][0]["resource"] == "fpga"
    assert results[2]["body"]["error"]["details"]["field"] == "colour"
    assert results[3]["body"]["error"]["code"] == "invalid_quantity"
    assert results[4]["body"]["error"]["code"] == "not_found"
    assert results[5]["body"]["error"]["details"]["field"] == "id"
    assert results[6]["body"]["error"]["details"]["field"] == "op"
    # Only the reservation that succeeded holds anything.
    assert service.engine.usage("root.a")["fpga"].reserved == 1
    second = _batch(
        service,
        "service",
        [
            {"op": "commit", "id": made["id"], "resources": {"fpga": 1}},
            {"op": "rollback", "id": made["id"]},
        ],
    )
    statuses = sorted(r["status"] for r in second)
    # The two run at the same time: whichever is decided first wins, the other is refused.
    assert statuses == [200, 409]
    assert service.engine.get(made["id"]).state.value in ("committed", "rolled_back")


def test_each_result_is_what_the_single_request_answers(service: Service) -> None:
    _configure(service)
    requests = [
        {"queue": "root.a", "resources": {"fpga": 1}, "colour": "red"},
        {"queue": "root.a", "resources": {"memory": "12Q"}},
        {"queue": "root.a", "resources": {"fpga": 5}},
        {"resources": {"fpga": 1}},
        {"queue": "not a queue", "resources": {}},
    ]
    with service.client("service") as api:
        singles = [api.post("/v1/reservations", json=body) for body in requests]
        commit = api.post(f"/v1/reservations/{ZERO_ID}/commit")
    results = _batch(
        service,
        "service",
        [{"op": "reserve", **body} for body in requests] + [{"op": "commit", "id": ZERO_ID}],
    )
    for single, result in zip([*singles, commit], results, strict=True):
        assert (result["status"], result["body"]) == (single.status_code, single.json())
    made = _batch(service, "service", [{"op": "reserve", "queue": "root.b", "resources": {"fpga": 1}}])[0]
    with service.client("service") as api:
        fetched = api.get(f"/v1/reservations/{made['body']['id']}").json()
        rolled = api.post(f"/v1/reservations/{made['body']['id']}/rollback").json()
    assert made["body"] == fetched
    again = _batch(service, "service", [{"op": "rollback", "id": made["body"]["id"]}])[0]
    assert again == {"status": 200, "body": rolled}


def test_a_restricted_token_is_held_to_its_queue_per_operation(service: Service) -> None:
    _configure(service)
    other = service.engine.reserve("root.b", {"fpga": 1})
    results = _batch(
        service,
        "team-a",
        [
            {"op": "reserve", "queue": "root.a", "resources": {"fpga": 1}},
            {"op": "reserve", "queue": "root.b", "resources": {"fpga": 1}},
            {"op": "commit", "id": other.id},
            {"op": "rollback", "id": other.id},
        ],
    )
    assert [r["status"] for r in results] == [201, 403, 404, 404]
    assert results[1]["body"]["error"]["code"] == "forbidden"
    assert service.engine.get(other.id).state.value == "pending"
    assert service.engine.usage("root.b")["fpga"].reserved == 1
    with service.client("reader") as reader:
        refused = reader.post("/v1/batch", json={"operations": []})
    assert refused.status_code == 403
    with service.client(None) as anonymous:
        assert anonymous.post("/v1/batch", json={"operations": []}).status_code == 401


def test_a_batch_carries_a_bounded_number_of_operations(service: Service) -> None:
    unknown = {"op": "nothing"}
    with service.client("service") as api:
        full = api.post("/v1/batch", json={"operations": [unknown] * batch.MAX_OPERATIONS})
        over = api.post("/v1/batch", json={"operations": [unknown] * (batch.MAX_OPERATIONS + 1)})
        shapeless = api.post("/v1/batch", json={"operations": [1]})
    assert full.status_code == 200
    assert len(full.json()["results"]) == batch.MAX_OPERATIONS
    assert over.status_code == 422
    assert over.json()["error"]["code"] == "invalid_request"
    assert over.json()["error"]["details"]["field"] == "operations"
    assert shapeless.status_code == 422
