"""Configuration changes over HTTP and through the CLI's ``--url``: the dry run, the confirmation
before every limit goes, and what ``GET /v1/config`` returns going back in unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from http_support import Service

QUEUES_YAML = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: a
            resources: {max: {vcore: 4, memory: 8Gi}}
            limits:
              - {users: ["*"], maxresources: {vcore: 2}}
"""
YAML = {"Content-Type": "application/yaml"}


def test_get_config_round_trips_as_json_and_as_yaml(service: Service) -> None:
    with service.client("admin") as admin:
        assert admin.put("/v1/config", content=QUEUES_YAML, headers=YAML).json() == {"version": 1}
        as_json = admin.get("/v1/config")
        assert as_json.json()["version"] == 1
        as_yaml = admin.get("/v1/config", headers={"Accept": "application/yaml"})
        assert as_yaml.status_code == 200
        assert as_yaml.headers["content-type"].startswith("application/yaml")
        assert as_yaml.headers["x-config-version"] == "1"
        assert yaml.safe_load(as_yaml.text) == as_json.json()["config"]
        for body, kind in ((as_json.content, "application/json"), (as_yaml.content, "application/yaml")):
            headers = {"Content-Type": kind}
            checked = admin.post("/v1/config/validate", content=body, headers=headers)
            assert checked.json() == {"allowed": True, "problems": []}, kind
            applied = admin.put("/v1/config", content=body, headers=headers)
            assert applied.json() == {"version": 1}, kind  # the same configuration: no new version
            assert admin.post("/v1/config/diff", content=body, headers=headers).json()["identical"], kind
        assert (
            admin.get("/v1/config", headers={"Accept": "application/yaml;q=0, application/json"}).json()[
                "version"
            ]
            == 1
        )


def test_the_diff_is_a_dry_run_a_reader_may_ask_for(service: Service) -> None:
    with service.client("admin") as admin:
        admin.put("/v1/config", content=QUEUES_YAML, headers=YAML)
    with service.client("service") as api:
        body = {"queue": "root.a", "resources": {"vcore": "2"}, "user": "sue", "application": "app-1"}
        assert api.post("/v1/reservations", json=body).status_code == 201
        plain = {"queue": "root.a", "resources": {"vcore": 1}}
        assert api.post("/v1/reservations", json=plain).status_code == 201
    lowered = QUEUES_YAML.replace(
        '{users: ["*"], maxresources: {vcore: 2}}', '{users: ["*"], maxresources: {vcore: 1}}'
    )
    lowered = lowered.replace("max: {vcore: 4, memory: 8Gi}", "max: {vcore: 2}")
    with service.client("reader") as reader:
        found = reader.post("/v1/config/diff", content=lowered, headers=YAML)
        assert found.status_code == 200, found.text
        diff = found.json()
    assert set(diff) == {"version", "identical", "limits", "over_limit", "removes_all_limits"}
    assert diff["version"] == 1
    assert diff["identical"] is False
    assert diff["limits"]["added"] == []
    assert diff["limits"]["removed"] == [
        {
            "partition": "default",
            "kind": "queue",
            "name": None,
            "queue": "root.a",
            "resource": "memory",
            "old": 8 * 2**30,
            "new": None,
        }
    ]
    assert {(c["kind"], c["name"], c["resource"], c["old"], c["new"]) for c in diff["limits"]["changed"]} == {
        ("queue", None, "vcore", 4000, 2000),
        ("user", "*", "vcore", 2000, 1000),
    }
    over = {(o["kind"], o["name"], o["resource"]): o for o in diff["over_limit"]}
    assert over[("queue", None, "vcore")]["reserved"] == 3000
    assert over[("queue", None, "vcore")]["limit"] == 2000
    assert over[("user", "sue", "vcore")] == {
        "partition": "default",
        "kind": "user",
        "name": "sue",
        "queue": "root.a",
        "resource": "vcore",
        "in_use": 0,
        "reserved": 2000,
        "limit": 1000,
        "old_limit": 2000,
    }
    assert diff["removes_all_limits"] == []
    with service.client("admin") as admin:
        assert admin.get("/v1/config").json()["version"] == 1  # the diff changed nothing


def test_removing_every_limit_needs_confirm_remove_all(service: Service) -> None:
    with service.client("admin") as admin:
        admin.put("/v1/config", content=QUEUES_YAML, headers=YAML)
        refused = admin.put("/v1/config", json={"partitions": []})
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "removes_all_limits"
        assert refused.json()["error"]["details"]["partitions"] == ["default"]
        assert admin.get("/v1/limits").json()["root.a"]["vcore"] == 4000
        odd = admin.put("/v1/config", params={"confirm": "yes"}, json={"partitions": []})
        assert odd.status_code == 422
        done = admin.put("/v1/config", params={"confirm": "remove-all"}, json={"partitions": []})
        assert done.json() == {"version": 2}
        assert admin.get("/v1/limits").json() == {}


def test_a_reservation_without_resources_is_refused(service: Service) -> None:
    with service.client("service") as api:
        refused = api.post("/v1/reservations", json={"queue": "root.a"})
        assert refused.status_code == 422
        assert refused.json()["error"]["code"] == "invalid_request"
        assert refused.json()["error"]["details"]["field"] == "resources"


def cli(service: Service, *args: str, role: str = "admin") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTA_LEDGER_")}
    env |= {"QUOTA_LEDGER_URL": service.base, "QUOTA_LEDGER_TOKEN": service.tokens[role]}
    return subprocess.run(
        [sys.executable, "-m", "quota_ledger.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_diff_and_confirmed_apply_through_the_cli(service: Service, tmp_path: Path) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text(QUEUES_YAML)
    assert "applied configuration version 1" in cli(service, "config", "apply", str(config)).stdout
    again = cli(service, "config", "apply", str(config))
    assert "configuration unchanged: version 1 stays in force" in again.stdout
    empty = tmp_path / "empty.yaml"
    empty.write_text("partitions: []\n")
    diff = cli(service, "config", "diff", str(empty), role="reader")
    assert diff.returncode == 0, diff.stderr
    removed = next(line for line in diff.stdout.splitlines() if "memory" in line)
    assert removed.split() == ["-", "queue", "root.a", "memory", "was", "8Gi"]
    assert "removes every limit of partition default" in diff.stdout
    as_json = json.loads(cli(service, "config", "diff", str(empty), "--json", role="reader").stdout)
    assert as_json["removes_all_limits"] == ["default"]
    refused = cli(service, "config", "apply", str(empty))
    assert refused.returncode == 1
    assert "--allow-removing-all" in refused.stderr
    assert "version 2" in cli(service, "config", "apply", str(empty), "--allow-removing-all").stdout
    nothing = cli(service, "reserve", "root.a", role="service")
    assert nothing.returncode == 1
    assert "at least one resource" in nothing.stderr
