"""The CLI driving a running service (``--url``, ``--token``) as it drives a database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from http_support import Service


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


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_ledger_commands_through_the_service(service: Service, tmp_path: Path) -> None:
    ok(cli(service, "limits", "set", "root.a", "fpga=2"))
    assert json.loads(ok(cli(service, "limits", "show", "--json")))["root.a"] == {"fpga": 2}
    made = json.loads(
        ok(cli(service, "reserve", "root.a", "fpga=1", "--key", "k1", "--json", role="service"))
    )
    assert made["state"] == "pending"
    over = cli(service, "reserve", "root.a", "fpga=2", "--json", role="service")
    assert over.returncode == 3
    assert json.loads(over.stderr)["violations"][0]["scope"] == "root.a"
    assert "committed" in ok(cli(service, "commit", made["id"], role="service"))
    usage = json.loads(ok(cli(service, "usage", "root.a", "--json", role="reader")))
    assert usage["fpga"] == {"in_use": 1, "reserved": 0, "limit": 2, "available": 1}
    assert "fpga" in ok(cli(service, "usage", "root.a", role="reader"))
    ok(cli(service, "release", "root.a", "fpga=1", role="service"))
    assert "audit clean" in ok(cli(service, "audit", role="reader"))
    denied = cli(service, "limits", "set", "root.a", "fpga=3", role="reader")
    assert denied.returncode == 1
    assert "403" in denied.stderr


def test_config_users_and_kubernetes_through_the_service(service: Service, tmp_path: Path) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text(
        "partitions:\n  - name: default\n    queues:\n      - name: root\n        queues:\n"
        "          - name: dev\n            limits:\n"
        "              - {users: [sue], maxresources: {vcore: 2}}\n"
    )
    assert "version 1" in ok(cli(service, "config", "apply", str(config)))
    assert "name: dev" in ok(cli(service, "config", "show", role="reader"))
    ok(cli(service, "reserve", "root.dev", "vcore=1", "--user", "sue", "--application", "a1", role="service"))
    assert json.loads(ok(cli(service, "users", "sue", "--json", role="reader")))["userName"] == "sue"
    header = ok(cli(service, "users", role="reader")).splitlines()[0]
    assert header.split()[:3] == ["USER", "QUEUE", "APPLICATIONS"]
    quota = tmp_path / "quota.yaml"
    quota.write_text("kind: ResourceQuota\nmetadata: {name: q, namespace: team}\nspec: {hard: {pods: '1'}}\n")
    assert json.loads(ok(cli(service, "quota", "apply", str(quota))))["used"] == {"pods": "0"}
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        "kind: Pod\nmetadata: {name: web, namespace: team, uid: u-9}\n"
        "spec: {containers: [{name: c, resources: {requests: {cpu: 100m}}}]}\n"
    )
    reserved = json.loads(ok(cli(service, "pod", "reserve", str(pod), "--json", role="service")))
    ok(cli(service, "commit", reserved["id"], role="service"))
    assert json.loads(ok(cli(service, "quota", "status", "team", "q", role="reader")))["used"] == {
        "pods": "1"
    }
    ok(cli(service, "pod", "release", str(pod), role="service"))
    assert json.loads(ok(cli(service, "quota", "status", "team", "q", role="reader")))["used"] == {
        "pods": "0"
    }


def test_database_only_commands_refuse_a_url(service: Service) -> None:
    for args in (("db", "upgrade"), ("sweep", "--once"), ("tokens", "list")):
        refused = cli(service, *args)
        assert refused.returncode == 2, args
        assert "--db" in refused.stderr


def test_usage_tree_and_short_ids_through_the_service(service: Service) -> None:
    ok(cli(service, "limits", "set", "root.a", "memory=8Gi"))
    made = json.loads(ok(cli(service, "reserve", "root.a.b", "memory=2Gi", "--json", role="service")))
    tree = ok(cli(service, "usage", role="reader")).splitlines()
    assert tree[1].split()[:2] == ["QUEUE", "RESOURCE"]
    assert [line.split()[:6] for line in tree if line.strip().startswith("a ")] == [
        ["a", "memory", "0", "2Gi", "8Gi", "6Gi"]
    ]
    everything = json.loads(ok(cli(service, "usage", "--json", role="reader")))
    assert everything["root.a.b"]["memory"]["reserved"] == 2 * 2**30
    # a queue-restricted token sees its own subtree only
    restricted = json.loads(ok(cli(service, "usage", "--json", role="team-a")))
    assert set(restricted) == {"root.a", "root.a.b"}
    shown = ok(cli(service, "show", made["id"][:8], role="reader"))
    assert shown.startswith(f"{made['id']} pending root.a.b [memory=2Gi]")
    assert "committed" in ok(cli(service, "commit", made["id"][:6], role="service"))
    short = cli(service, "show", made["id"][:3], role="reader")
    assert short.returncode == 1
    assert "at least 4 characters" in short.stderr
    # a token restricted to root.a does not learn of reservations outside it
    other = json.loads(ok(cli(service, "reserve", "root.z", "fpga=1", "--json", role="service")))
    hidden = cli(service, "show", other["id"][:8], role="team-a")
    assert hidden.returncode == 1
    assert f"reservation {other['id'][:8]} not found" in hidden.stderr
    with service.client("reader") as reader:
        assert reader.get("/v1/reservation-ids", params={"prefix": "----"}).status_code == 422


def test_a_missing_token_names_the_option_and_the_variable(service: Service) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTA_LEDGER_")}
    result = subprocess.run(
        [sys.executable, "-m", "quota_ledger.cli", "--url", service.base, "usage"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "a bearer token is required" in result.stderr
    assert "--token" in result.stderr
    assert "QUOTA_LEDGER_TOKEN" in result.stderr
