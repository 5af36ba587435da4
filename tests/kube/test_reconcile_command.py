"""``quota-ledger kube reconcile`` run as a user would (a subprocess, a kubeconfig pointing at the
fake API server): it charges the cluster's pods, serves its metrics, competes for the Lease, and
exits 0 on SIGTERM; its options override the QUOTA_LEDGER_RECONCILE_* settings."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from quota_ledger import QuotaEngine
from quota_ledger.cli import parser, reconcile_command
from tests.kube.conftest import eventually, pod
from tests.kube.fake_apiserver import FakeApiServer


def _kubeconfig(tmp_path: Path, api: FakeApiServer) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                "users": [{"name": "reconciler", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "reconciler"}}],
                "current-context": "fake",
            }
        )
    )
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_command_reconciles_until_sigterm(
    tmp_path: Path, api: FakeApiServer, engine: QuotaEngine
) -> None:
    api.create("pods", pod("a"))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "QUOTA_LEDGER_"))}
    env |= {
        "QUOTA_LEDGER_DB": f"sqlite:///{tmp_path / 'ledger.db'}",
        "POD_NAMESPACE": "quota-ledger",
        "POD_NAME": "r-0",
    }
    env |= {"QUOTA_LEDGER_RECONCILE_METRICS_HOST": "127.0.0.1", "QUOTA_LEDGER_RECONCILE_RETRY_PERIOD": "0.2"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quota_ledger.cli",
            "kube",
            "reconcile",
            "--kubeconfig",
            str(_kubeconfig(tmp_path, api)),
            "--metrics-port",
            str(port),
            "--lease-duration",
            "3",
            "--renew-deadline",
            "2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        eventually(lambda: "vcore" in engine.usage("root.team"), timeout=30)
        assert engine.usage("root.team")["vcore"].in_use == 500
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "quota_ledger_reconciler_pods_charged_total 1.0" in metrics
        assert "quota_ledger_reconciler_leader 1.0" in metrics
        lease = api.get("leases", "quota-ledger", "quota-ledger-reconciler")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "r-0"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lease = api.get("leases", "quota-ledger", "quota-ledger-reconciler")
    assert lease is not None
    assert not lease["spec"].get("holderIdentity")  # given up on the way out


def test_options_override_the_environments_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUOTA_LEDGER_RECONCILE_RELIST_EVERY", "60")
    monkeypatch.setenv("QUOTA_LEDGER_RECONCILE_LEASE_NAME", "from-env")
    args = parser.build().parse_args(["kube", "reconcile", "--lease-name", "given", "--write-status"])
    settings = reconcile_command.settings_from(args)
    assert (settings.relist_every, settings.lease_name, settings.write_status) == (60.0, "given", True)
    assert (settings.leader_election, settings.metrics_port) == (True, None)
    args = parser.build().parse_args(["kube", "reconcile", "--no-leader-election", "--relist-every", "30"])
    settings = reconcile_command.settings_from(args)
    assert (settings.relist_every, settings.leader_election, settings.write_status) == (30.0, False, False)


DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def test_the_deployed_command_line_is_the_commands_and_its_lease_the_rbac_allows() -> None:
    (deployment,) = [
        doc
        for doc in yaml.safe_load_all((DEPLOY / "reconciler" / "deployment.yaml").read_text())
        if doc and doc["kind"] == "Deployment"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    patch = yaml.safe_load((DEPLOY / "reconciler-write-status" / "kustomization.yaml").read_text())
    (added,) = yaml.safe_load(patch["patches"][0]["patch"])
    for argv in (container["args"], [*container["args"], added["value"]]):
        args = parser.build().parse_args(argv)
        assert args.handler.__name__ == "_reconcile"
        settings = reconcile_command.settings_from(args)
        assert settings.write_status is (added["value"] in argv)
    env = {item["name"] for item in container["env"]}
    assert {"QUOTA_LEDGER_DB", "POD_NAME", "POD_NAMESPACE"} <= env  # the Lease's holder and namespace
    rules = [
        rule
        for doc in yaml.safe_load_all((DEPLOY / "reconciler" / "rbac.yaml").read_text())
        if doc and doc["kind"] == "Role"
        for rule in doc["rules"]
    ]
    named = {name for rule in rules for name in rule.get("resourceNames", [])}
    assert reconcile_command.settings_from(parser.build().parse_args(container["args"])).lease_name in named
