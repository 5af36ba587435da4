"""YuniKorn's usage endpoints, field by field against the documented DAO shapes."""

from __future__ import annotations

from typing import Any

from http_support import Service

CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            limits:
              - {users: [sue], maxresources: {vcore: 6}, maxapplications: 3}
              - {groups: [dev], maxresources: {vcore: 8}}
"""
USER_FIELDS = {"userName", "groups", "queues"}
GROUP_FIELDS = {"groupName", "applications", "queues"}
NODE_FIELDS = {
    "queuePath",
    "resourceUsage",
    "runningApplications",
    "maxResources",
    "maxApplications",
    "children",
}


def _check_node(node: dict[str, Any]) -> None:
    assert set(node) <= NODE_FIELDS
    assert isinstance(node["queuePath"], str)
    for key in ("resourceUsage", "maxResources"):
        if key in node:
            assert node[key], f"{key} is omitted when empty"
            assert all(isinstance(v, int) for v in node[key].values())
    if "maxApplications" in node:
        assert node["maxApplications"] > 0
    for child in node.get("children", []):
        assert child["queuePath"].startswith(node["queuePath"] + ".")
        _check_node(child)


def test_user_and_group_endpoints_have_yunikorns_shapes(service: Service) -> None:
    with service.client("admin") as admin:
        admin.put("/v1/config", content=CONFIG, headers={"Content-Type": "application/yaml"})
        made = admin.post(
            "/v1/reservations",
            json={
                "queue": "root.dev.x",
                "resources": {"vcore": "2"},
                "user": "sue",
                "groups": ["dev"],
                "application": "app-1",
            },
        )
        assert made.status_code == 201, made.text
    with service.client("reader") as reader:
        base = "/ws/v1/partition/default/usage"
        users = reader.get(f"{base}/users").json()
        assert [u["userName"] for u in users] == ["sue"]
        sue = reader.get(f"{base}/user/sue").json()
        assert set(sue) == USER_FIELDS
        assert sue["groups"] == {"app-1": "dev"}
        _check_node(sue["queues"])
        assert sue["queues"]["queuePath"] == "root"
        assert sue["queues"]["resourceUsage"] == {"vcore": 2000}
        dev = sue["queues"]["children"][0]
        assert (dev["queuePath"], dev["maxResources"], dev["maxApplications"]) == (
            "root.dev",
            {"vcore": 6000},
            3,
        )
        group = reader.get(f"{base}/group/dev").json()
        assert set(group) == GROUP_FIELDS
        assert group["applications"] == ["app-1"]
        _check_node(group["queues"])
        assert [g["groupName"] for g in reader.get(f"{base}/groups").json()] == ["dev"]


def test_yunikorn_errors(service: Service) -> None:
    with service.client("reader") as reader:
        base = "/ws/v1/partition/default/usage"
        unknown = reader.get(f"{base}/user/nobody")
        assert unknown.status_code == 404
        assert unknown.json() == {
            "status_code": 404,
            "message": "User not found",
            "description": "User not found",
        }
        assert reader.get(f"{base}/user/9bad").json()["message"] == "Invalid user name"
        assert reader.get(f"{base}/group/a@b").json()["message"] == "Invalid group name"
        assert reader.get(f"{base}/group/nobody").status_code == 404
        assert reader.get(f"{base}/users").json() == []
