"""POST /v1/batch: each operation decided as its own request would be, results in order."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from http_support import Service

from quota_ledger.http import batch

LIMITS = {"partitions": [{"name": "default", "queues": [{"name": "root", "queues": [
    {"name": "a", "resources": {"max": {"fpga": 4}}},
    {"name": "b", "resources": {"max": {"fpga": 4}}},
]}]}]}  # fmt: skip
ZERO_ID = "00000000-0000-0000-0000-000000000000"
BATCHING = {"batching": True}
#: the service's default: group commit decides the operations of a batch together
with_batching = pytest.mark.parametrize("service", [BATCHING], indirect=True)


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


@pytest.mark.parametrize("service", [{"batching": False}, BATCHING], indirect=True)
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


@with_batching
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


@with_batching
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


@with_batching
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


@with_batching
def test_concurrent_requests_and_batches_on_one_queue_add_up(service: Service) -> None:
    _configure(service)
    with service.client("admin") as admin:
        assert admin.put("/v1/queues/root.a/limits", json={"resources": {"fpga": 10_000}}).status_code == 200

    def singles(_: int) -> int:
        with service.client("service") as api:
            for _ in range(10):
                made = api.post("/v1/reservations", json={"queue": "root.a", "resources": {"fpga": 1}})
                assert made.status_code == 201, made.text
                assert api.post(f"/v1/reservations/{made.json()['id']}/commit").status_code == 200
        return 10

    def batches(_: int) -> int:
        made = _batch(
            service, "service", [{"op": "reserve", "queue": "root.a", "resources": {"fpga": 1}}] * 50
        )
        ids = [r["body"]["id"] for r in made if r["status"] == 201]
        done = _batch(service, "service", [{"op": "commit", "id": rid} for rid in ids])
        return sum(r["status"] == 200 for r in done)

    with ThreadPoolExecutor(8) as pool:
        committed = sum(pool.map(singles, range(4))) + sum(pool.map(batches, range(4)))
    assert committed == 4 * 10 + 4 * 50
    usage = service.engine.usage("root.a")["fpga"]
    assert (usage.in_use, usage.reserved) == (committed, 0)
    assert service.engine.audit() == []
    assert service.engine.batch_stats.largest > 1
    with service.client("reader") as reader:
        text = reader.get("/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("quota_ledger_group_commit_requests_total "))
    decided = float(line.split()[1])
    assert decided >= committed * 2


@pytest.mark.parametrize("service", [{"batching": True, "max_batch": 8}], indirect=True)
def test_a_batch_larger_than_a_group_commit_batch_is_decided_in_several(service: Service) -> None:
    _configure(service)
    with service.client("admin") as admin:
        assert admin.put("/v1/queues/root.a/limits", json={"resources": {"fpga": 100}}).status_code == 200
    before = service.engine.batch_stats
    results = _batch(
        service,
        "service",
        [{"op": "reserve", "queue": "root.a", "resources": {"fpga": 1}}] * 20
        + [{"op": "reserve", "queue": "root.b", "resources": {"fpga": 2}}] * 3
        + [{"op": "commit", "id": ZERO_ID}],
    )
    # in the order sent, 8 a transaction: the third root.b reservation no longer fits
    assert [r["status"] for r in results] == [201] * 22 + [409, 404]
    assert len({r["body"]["id"] for r in results[:22]}) == 22
    after = service.engine.batch_stats
    assert (after.batches - before.batches, after.requests - before.requests) == (3, 24)
    assert after.largest == 8
    assert (
        service.engine.usage("root.a")["fpga"].reserved,
        service.engine.usage("root.b")["fpga"].reserved,
    ) == (
        20,
        4,
    )
