"""``GET /v1/reservations`` without ``key`` lists reservations by filters, within the token's
scope; ``POST /v1/prune`` lists the counters at zero that nothing references and, with
``apply=true`` and the admin role, deletes them."""

from __future__ import annotations

from http_support import Service


def test_the_listing_filters_and_says_when_more_match(service: Service) -> None:
    with service.client("service") as api:
        made = [
            api.post("/v1/reservations", json={"queue": q, "resources": {"vcore": 1}, "user": u}).json()
            for q, u in (("root.a", "sue"), ("root.a.x", "bob"), ("root.b", "sue"))
        ]
        api.post(f"/v1/reservations/{made[2]['id']}/commit")
    with service.client("reader") as api:
        every = api.get("/v1/reservations").json()
        assert [r["id"] for r in every["reservations"]] == [r["id"] for r in made]
        assert every["more"] is False
        subtree = api.get("/v1/reservations", params={"queue": "root.a"}).json()
        assert [r["queue"] for r in subtree["reservations"]] == ["root.a", "root.a.x"]
        pending = api.get("/v1/reservations", params={"state": "pending", "user": "sue"}).json()
        assert [r["queue"] for r in pending["reservations"]] == ["root.a"]
        first = api.get("/v1/reservations", params={"limit": 2}).json()
        assert (len(first["reservations"]), first["more"]) == (2, True)
        assert api.get("/v1/reservations", params={"older_than": "1h"}).json()["reservations"] == []
        bad = api.get("/v1/reservations", params={"state": "stuck"})
        assert bad.status_code == 422
        assert bad.json()["error"]["details"]["field"] == "state"
        assert api.get("/v1/reservations", params={"older_than": "soon"}).status_code == 422
        by_key = api.get("/v1/reservations", params={"key": "none-such"})
        assert by_key.status_code == 404


def test_a_token_restricted_to_a_subtree_lists_only_its_subtree(service: Service) -> None:
    with service.client("service") as api:
        for queue in ("root.a", "root.a.x", "root.b"):
            assert api.post("/v1/reservations", json={"queue": queue, "resources": {"vcore": 1}}).is_success
    with service.client("team-a") as api:
        mine = api.get("/v1/reservations").json()["reservations"]
        assert sorted(r["queue"] for r in mine) == ["root.a", "root.a.x"]
        assert api.get("/v1/reservations", params={"queue": "root.b"}).status_code == 403
        assert api.get("/v1/reservations", params={"queue": "root"}).status_code == 403
        assert api.get("/v1/reservations", params={"partition": "other"}).status_code == 403


def test_prune_is_a_dry_run_unless_an_admin_applies_it(service: Service) -> None:
    with service.client("service") as api:
        made = api.post("/v1/reservations", json={"queue": "root.gone", "resources": {"fpga": 1}}).json()
        api.post(f"/v1/reservations/{made['id']}/rollback")
    idle = {"partition": "default", "kind": "queue", "queue": "root.gone", "resource": "fpga", "name": None}
    with service.client("reader") as api:
        assert api.post("/v1/prune").json() == {"applied": False, "counters": [idle]}
        assert api.post("/v1/prune", params={"apply": "true"}).status_code == 403
    with service.client("team-a") as api:
        assert api.post("/v1/prune").status_code == 403  # a subtree's token cannot see the partition
    with service.client("admin") as api:
        assert api.post("/v1/prune", params={"apply": "true"}).json() == {"applied": True, "counters": [idle]}
        assert api.post("/v1/prune").json() == {"applied": False, "counters": []}
