"""A token restricted to a queue subtree learns nothing of the rest of its partition: not that an
idempotency key is used there, nor the usage of a queue above its subtree when a limit there
refuses it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from http_support import Service
from test_cli_remote import cli

from quota_ledger.model.errors import ReservationNotFound
from quota_ledger.runtime import tokens

ANCESTOR_LIMITED = """
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


def _reserve(client: Any, queue: str, fpga: int, key: str | None = None) -> Any:
    body: dict[str, Any] = {"queue": queue, "resources": {"fpga": fpga}}
    if key is not None:
        body["key"] = key
    return client.post("/v1/reservations", json=body)


# With tokens cached, plain reserves and commits take the fast lane (quota_ledger.http.fast_lane).
PATHS = [{}, {"batching": True}, {"batching": True, "token_cache_seconds": 60}]
PATH_IDS = ["alone", "batching", "fast-lane"]


@pytest.mark.parametrize("service", PATHS, indirect=True, ids=PATH_IDS)
def test_a_key_used_outside_the_subtree_is_answered_as_a_key_never_used(service: Service) -> None:
    with service.client("service") as other:
        theirs = _reserve(other, "root.b", 1, "k")
        assert theirs.status_code == 201
    with service.client("team-a") as team:
        mine = _reserve(team, "root.a", 1, "k")
        assert mine.status_code == 201, mine.text
        assert mine.json()["key"] == "k"
        assert mine.json()["id"] != theirs.json()["id"]
        # a retry finds its reservation, whichever way it comes
        assert _reserve(team, "root.a", 1, "k").json()["id"] == mine.json()["id"]
        header = team.post(
            "/v1/reservations",
            json={"queue": "root.a", "resources": {"fpga": 1}},
            headers={"Idempotency-Key": "k"},
        )
        assert header.json()["id"] == mine.json()["id"]
        batch = team.post(
            "/v1/batch",
            json={"operations": [{"op": "reserve", "queue": "root.a", "resources": {"fpga": 1}, "key": "k"}]},
        )
        assert batch.json()["results"] == [{"status": 201, "body": mine.json()}]
        found = team.get("/v1/reservations", params={"key": "k"})
        assert found.json() == mine.json()
        assert team.get(f"/v1/reservations/{mine.json()['id']}").json()["key"] == "k"
        committed = team.post(f"/v1/reservations/{mine.json()['id']}/commit")
        assert committed.json()["key"] == "k"
        # another request under the key conflicts with the token's own reservation, named
        clash = _reserve(team, "root.a", 2, "k")
        assert clash.status_code == 409
        assert clash.json()["error"]["code"] == "idempotency_conflict"
        assert mine.json()["id"] in clash.json()["error"]["message"]
        assert theirs.json()["id"] not in clash.text
    with service.client("service") as unrestricted:
        assert unrestricted.get("/v1/reservations", params={"key": "k"}).json()["id"] == theirs.json()["id"]
        stored = unrestricted.get(f"/v1/reservations/{mine.json()['id']}").json()["key"]
        assert stored.startswith("k~")  # the scoped form, as stored


def test_a_key_used_inside_the_subtree_is_still_a_conflict(service: Service) -> None:
    with service.client("service") as other:
        theirs = _reserve(other, "root.a.x", 1, "k")
    with service.client("team-a") as team:
        clash = _reserve(team, "root.a", 1, "k")
        assert clash.status_code == 409
        assert theirs.json()["id"] in clash.json()["error"]["message"]


@pytest.mark.parametrize("service", PATHS[1:], indirect=True, ids=PATH_IDS[1:])
def test_a_limit_above_the_subtree_refuses_without_its_usage(service: Service) -> None:
    with service.client("admin") as admin:
        put = admin.put("/v1/config", content=ANCESTOR_LIMITED, headers={"Content-Type": "application/yaml"})
        assert put.status_code == 200, put.text
    service.tokens["team-pa"] = tokens.add(service.engine, "team-pa", "service", queue="root.p.a")
    with service.client("service") as other:
        assert _reserve(other, "root.p.b", 2).status_code == 201
    with service.client("team-pa") as team:
        refused = team.post("/v1/reservations", json={"queue": "root.p.a", "resources": {"fpga": 3}})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "over_quota"
        assert error["details"]["violations"] == [
            {
                "scope": "root.p",
                "resource": "fpga",
                "limit": 4,
                "in_use": None,
                "reserved": None,
                "requested": 3,
                "partition": "default",
                "kind": "queue",
                "name": None,
                "shortfall": 1,
            }
        ]
        assert error["message"] == "over quota: fpga at root.p: limit 4, requested 3, over by 1"
        # a limit inside the subtree is shown whole
        inside = team.post("/v1/reservations", json={"queue": "root.p.a", "resources": {"fpga": 4}})
        shown = {v["scope"]: v for v in inside.json()["error"]["details"]["violations"]}
        assert (shown["root.p.a"]["in_use"], shown["root.p.a"]["reserved"]) == (0, 0)
        assert shown["root.p.a"]["shortfall"] == 1
        assert (shown["root.p"]["in_use"], shown["root.p"]["shortfall"]) == (None, 2)
        batch = team.post(
            "/v1/batch",
            json={"operations": [{"op": "reserve", "queue": "root.p.a", "resources": {"fpga": 3}}]},
        )
        assert batch.json()["results"] == [{"status": 409, "body": refused.json()}]
    # the CLI over HTTP says what the service said
    printed = cli(service, "reserve", "root.p.a", "fpga=3", role="team-pa")
    assert printed.returncode == 3
    assert printed.stderr.splitlines()[0] == f"error: {error['message']}"
    # and nothing of the limit's usage or holders after it
    assert printed.stderr.splitlines()[1:] == []
    as_json = json.loads(cli(service, "reserve", "root.p.a", "fpga=3", "--json", role="team-pa").stderr)
    assert as_json["violations"][0]["in_use"] is None
    with service.client("service") as unrestricted:
        whole = unrestricted.post("/v1/reservations", json={"queue": "root.p.a", "resources": {"fpga": 3}})
        violation = whole.json()["error"]["details"]["violations"][0]
        assert (violation["reserved"], violation["shortfall"]) == (2, 1)


def test_a_release_key_used_outside_the_subtree_is_no_conflict(service: Service) -> None:
    with service.client("service") as other, service.client("team-a") as team:
        for client, queue in ((other, "root.b"), (team, "root.a")):
            made = _reserve(client, queue, 2)
            assert client.post(f"/v1/reservations/{made.json()['id']}/commit").status_code == 200
        release = {"queue": "root.b", "resources": {"fpga": 1}, "key": "r"}
        assert other.post("/v1/releases", json=release).status_code == 204
        mine = release | {"queue": "root.a"}
        assert team.post("/v1/releases", json=mine).status_code == 204, "a key used elsewhere"
        assert team.post("/v1/releases", json=mine).status_code == 204  # a retry: once
        assert team.get("/v1/queues/root.a/usage").json()["fpga"]["in_use"] == 1
        clash = team.post("/v1/releases", json=mine | {"resources": {"fpga": 2}})
        assert clash.status_code == 409
        assert "'r'" in clash.json()["error"]["message"]  # the key it sent
        assert team.post("/v1/releases", json=mine | {"key": 7}).status_code == 422


def test_a_pod_uid_used_outside_the_subtree_is_no_conflict(service: Service) -> None:
    def pod(namespace: str) -> dict[str, Any]:
        return {
            "metadata": {"namespace": namespace, "name": "p", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        }

    with service.client("service") as other:
        theirs = other.post("/v1/reservations", json={"pod": pod("b")})  # root.b
        assert theirs.json()["key"] == "u1"
    with service.client("team-a") as team:
        mine = team.post("/v1/reservations", json={"pod": pod("a")})  # root.a
        assert mine.status_code == 201, mine.text
        assert (mine.json()["queue"], mine.json()["key"]) == ("root.a", "u1")
        assert team.post("/v1/reservations", json={"pod": pod("a")}).json()["id"] == mine.json()["id"]
        assert team.get("/v1/reservations", params={"key": "u1"}).json()["id"] == mine.json()["id"]


def test_the_admission_webhook_refuses_a_restricted_token(service: Service) -> None:
    service.tokens["admin-a"] = tokens.add(service.engine, "admin-a", "admin", queue="root.a")
    service.tokens["admission-a"] = tokens.add(service.engine, "admission-a", "admission", queue="root.a")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "b", "name": "p", "uid": "u-outside"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }
    request = {
        "uid": "r-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "b",
        "operation": "CREATE",
        "userInfo": {"username": "alice", "groups": []},
        "object": pod,
        "dryRun": False,
    }
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    for role in ("admin-a", "admission-a"):
        with service.client(role) as restricted:
            refused = restricted.post("/v1/admission/pods", json=review)
            assert refused.status_code == 403, refused.text
    with pytest.raises(ReservationNotFound):
        service.engine.get_by_key("u-outside")
    with service.client("admission") as unrestricted:
        answered = unrestricted.post("/v1/admission/pods", json=review)
        assert answered.status_code == 200, answered.text
