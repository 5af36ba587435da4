"""The ``quota-ledger`` command, run as a user would: in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

EXIT_OVER_QUOTA, EXIT_DRIFT = 3, 4


def cli(
    *args: str, db: URL | str | None = None, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if k != "QUOTA_LEDGER_DB"}, **(env or {})}
    if db is not None:
        env["QUOTA_LEDGER_DB"] = db.render_as_string(hide_password=False) if isinstance(db, URL) else db
    return subprocess.run(
        [sys.executable, "-m", "quota_ledger.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_reserve_commit_rollback_release_flow(db_url: URL) -> None:
    ok(cli("limits", "set", "root.project-a", "fpga=5", "memory=64Gi", db=db_url))
    reserved = json.loads(
        ok(cli("reserve", "root.project-a", "fpga=2", "memory=4Gi", "--key", "r1", "--json", db=db_url))
    )
    assert reserved["state"] == "pending"
    assert reserved["resources"] == {"fpga": 2, "memory": 4 * 2**30}
    refused = cli("reserve", "root.project-a.x", "fpga=4", "--json", db=db_url)
    assert refused.returncode == EXIT_OVER_QUOTA
    error = json.loads(refused.stderr)
    assert error["error"] == "OverQuota"
    assert error["violations"][0]["scope"] == "root.project-a"
    assert "committed" in ok(cli("commit", reserved["id"], db=db_url))
    second = json.loads(ok(cli("reserve", "root.project-a", "fpga=1", "--json", db=db_url)))
    assert "rolled_back" in ok(cli("rollback", second["id"], db=db_url))
    ok(cli("release", "root.project-a", "fpga=1", db=db_url))
    usage = json.loads(ok(cli("usage", "root.project-a", "--json", db=db_url)))
    assert usage["fpga"] == {"in_use": 1, "reserved": 0, "limit": 5, "available": 4}
    assert "audit clean" in ok(cli("audit", db=db_url))


def test_usage_prints_a_readable_table(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    ok(cli("db", "upgrade", db=db))
    ok(cli("limits", "set", "root.a", "memory=8Gi", "vcore=4", db=db))
    ok(cli("reserve", "root.a.b", "memory=2Gi", "vcore=500m", db=db))
    table = ok(cli("usage", "root.a", db=db)).splitlines()
    assert table[1].split() == ["RESOURCE", "IN", "USE", "RESERVED", "LIMIT", "AVAILABLE", "USED"]
    memory = next(line for line in table if line.startswith("memory"))
    assert memory.split()[:6] == ["memory", "0", "2Gi", "8Gi", "6Gi", "25.0%"]
    vcore = next(line for line in table if line.startswith("vcore"))
    assert vcore.split()[:5] == ["vcore", "0", "500m", "4", "3500m"]


def test_database_defaults_to_a_sqlite_file_in_the_data_directory(tmp_path: Path) -> None:
    home = {"XDG_DATA_HOME": str(tmp_path / "data")}
    ledger = tmp_path / "data" / "quota-ledger" / "ledger.db"
    assert f"schema at 0019 in {ledger}" in ok(cli("db", "upgrade", cwd=tmp_path, env=home))
    assert ledger.is_file()
    ok(cli("reserve", "root.a", "fpga=1", cwd=tmp_path, env=home))
    other = tmp_path / "other.db"
    ok(cli("--db", f"sqlite:///{other}", "db", "upgrade", cwd=tmp_path, env=home))
    assert json.loads(ok(cli("--db", f"sqlite:///{other}", "usage", "--json", cwd=tmp_path, env=home))) == {}
    assert json.loads(ok(cli("usage", "root", "--json", cwd=tmp_path, env=home)))["fpga"]["reserved"] == 1
    assert list(tmp_path.glob("*.db")) == [other]  # nothing in the working directory


def test_a_read_on_a_missing_ledger_says_so_and_leaves_no_file(tmp_path: Path) -> None:
    home = {"XDG_DATA_HOME": str(tmp_path / "data")}
    ledger = tmp_path / "data" / "quota-ledger" / "ledger.db"
    for args in (("usage", "root.dev"), ("limits", "show"), ("config", "show"), ("db", "current")):
        result = cli(*args, cwd=tmp_path, env=home)
        assert result.returncode == 1, result.stderr
        assert f"no ledger at {ledger}: run `quota-ledger db upgrade`" in result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()
    assert list(tmp_path.iterdir()) == []
    as_json = cli("usage", "--json", cwd=tmp_path, env=home)
    assert json.loads(as_json.stderr)["error"] == "LedgerMissing"


def test_sweep_once_expires_what_ran_out(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    ok(cli("db", "upgrade", db=db))
    ok(cli("reserve", "root.a", "fpga=1", "--ttl", "0.2", db=db))
    ok(cli("reserve", "root.a", "fpga=2", "--ttl", "600", db=db))
    time.sleep(0.3)
    refused = cli("sweep", "--once", "--max-rate", "0", "--json", db=db)
    assert refused.returncode != 0
    assert "max_rate" in refused.stdout + refused.stderr
    assert json.loads(ok(cli("sweep", "--once", "--max-rate", "1000", "--json", db=db))) == {"expired": 1}
    assert json.loads(ok(cli("usage", "root.a", "--json", db=db)))["fpga"]["reserved"] == 2


def test_sweep_loop_stops_on_sigterm(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    ok(cli("db", "upgrade", db=db))
    ok(cli("reserve", "root.a", "fpga=1", "--ttl", "0.1", db=db))
    env = {**os.environ, "QUOTA_LEDGER_DB": db}
    proc = subprocess.Popen(
        [sys.executable, "-m", "quota_ledger.cli", "sweep", "--interval", "0.1", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            usage = json.loads(ok(cli("usage", "root.a", "--json", db=db)))
            if usage["fpga"]["reserved"] == 0:
                break
            time.sleep(0.2)
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert json.loads(out) == {"expired": 1}


def test_audit_exit_code_reports_drift_and_fix_repairs_it(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "l.db"
    db = f"sqlite:///{path}"
    ok(cli("db", "upgrade", db=db))
    ok(cli("reserve", "root.a", "fpga=3", db=db))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE quota_usages SET reserved = 1")
    found = cli("audit", "--json", db=db)
    assert found.returncode == EXIT_DRIFT
    [drift] = json.loads(found.stdout)
    assert (drift["reserved"], drift["expected_reserved"], drift["fixed"]) == (1, 3, False)
    fixed = json.loads(ok(cli("audit", "--fix", "--json", db=db)))
    assert fixed[0]["fixed"] is True
    assert "audit clean" in ok(cli("audit", db=db))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("reserve", "root.a", "fpga=-1"), "invalid quantity '-1' for resource 'fpga'"),
        (("reserve", "root.a", "fpga"), "expected RESOURCE=QUANTITY"),
        (("reserve", "project", "fpga=1"), "must start with 'root'"),
        (("commit", "no-such-id"), "not found"),
        (("release", "root.a", "fpga=1"), "cannot release more than is in use"),
    ],
)
def test_bad_input_exits_1_with_a_clear_message(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    ok(cli("db", "upgrade", db=db))
    result = cli(*args, db=db)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_unmigrated_database_says_to_run_db_upgrade(tmp_path: Path) -> None:
    result = cli("reserve", "root.a", "fpga=1", db=f"sqlite:///{tmp_path / 'new.db'}")
    assert result.returncode == 1
    assert "quota-ledger db upgrade" in result.stderr


QUEUES_YAML = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            resources: {max: {vcore: 4}}
            limits:
              - {users: ["*"], maxresources: {vcore: 1}}
"""


def test_config_apply_validate_show_and_user_usage(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    ok(cli("db", "upgrade", db=db))
    config = tmp_path / "queues.yaml"
    config.write_text(QUEUES_YAML)
    assert "configuration is valid" in ok(cli("config", "validate", str(config), db=db))
    assert "version 1" in ok(cli("config", "apply", str(config), db=db))
    assert "name: dev" in ok(cli("config", "show", db=db))
    bad = tmp_path / "bad.yaml"
    bad.write_text(QUEUES_YAML.replace("name: dev", "name: dev.x"))
    invalid = cli("config", "validate", str(bad), db=db)
    assert invalid.returncode == 1
    assert "root.dev.x" in invalid.stdout or "dev.x" in invalid.stdout
    refused = cli("config", "apply", str(bad), "--json", db=db)
    assert refused.returncode == 1
    assert json.loads(refused.stderr)["problems"]
    ok(cli("reserve", "root.dev", "vcore=1", "--user", "sue", "--application", "a1", db=db))
    over = cli("reserve", "root.dev", "vcore=1", "--user", "sue", "--application", "a1", db=db)
    assert over.returncode == EXIT_OVER_QUOTA
    report = json.loads(ok(cli("users", "sue", "--json", db=db)))
    assert report["queues"]["children"][0]["maxResources"] == {"vcore": 1000}
    assert [u["userName"] for u in json.loads(ok(cli("users", "--json", db=db)))] == ["sue"]


def test_quota_admission_and_pod_commands(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    ok(cli("db", "upgrade", db=db))
    (tmp_path / "quota.yaml").write_text(
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: q, namespace: team}\n"
        "spec: {hard: {pods: '1', requests.cpu: 500m}}\n"
    )
    (tmp_path / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: team, uid: u-1}\n"
        "spec: {containers: [{name: c, resources: {requests: {cpu: 250m}}}]}\n"
    )
    (tmp_path / "pod2.yaml").write_text(
        (tmp_path / "pod.yaml").read_text().replace("u-1", "u-2").replace("name: web", "name: web2")
    )
    assert json.loads(ok(cli("quota", "apply", str(tmp_path / "quota.yaml"), db=db)))["used"] == {
        "pods": "0",
        "requests.cpu": "0",
    }
    reserved = json.loads(ok(cli("pod", "reserve", str(tmp_path / "pod.yaml"), "--json", db=db)))
    assert reserved["key"] == "u-1"
    assert reserved["queue"] == "root.team"
    over = cli("pod", "reserve", str(tmp_path / "pod2.yaml"), db=db)
    assert over.returncode == EXIT_OVER_QUOTA
    assert "quota team/q" in over.stderr
    status = json.loads(ok(cli("quota", "status", "team", "q", db=db)))
    assert status["used"] == {"pods": "1", "requests.cpu": "250m"}
    ok(cli("commit", reserved["id"], db=db))
    ok(cli("pod", "release", str(tmp_path / "pod.yaml"), db=db))
    assert json.loads(ok(cli("quota", "status", "team", "q", db=db)))["used"]["pods"] == "0"
    ok(cli("quota", "delete", "team", "q", db=db))
    assert cli("quota", "status", "team", "q", db=db).returncode == 1


def test_serve_and_tokens(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    ok(cli("db", "upgrade", db=db))
    token = ok(cli("tokens", "add", "ops", "--role", "reader", db=db)).strip()
    assert token.startswith("qlt_")
    assert "ops" in ok(cli("tokens", "list", db=db))
    env = {k: v for k, v in os.environ.items() if k != "QUOTA_LEDGER_DB"} | {"QUOTA_LEDGER_DB": db}
    server = subprocess.Popen(
        [sys.executable, "-m", "quota_ledger.cli", "serve", "--port", "0", "--no-sweep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("quota-ledger serving on http://127.0.0.1:"), line
        base = line.split()[3]
        import urllib.error
        import urllib.request

        assert json.loads(urllib.request.urlopen(f"{base}/healthz", timeout=10).read()) == {"status": "ok"}
        request = urllib.request.Request(f"{base}/v1/config", headers={"Authorization": f"Bearer {token}"})
        assert json.loads(urllib.request.urlopen(request, timeout=10).read())["version"] == 0
        ok(cli("tokens", "revoke", "ops", db=db))
        time.sleep(5.5)  # the service trusts a verified token for token_cache_seconds (5 s)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_settings_come_from_a_settings_file(tmp_path: Path) -> None:
    target = tmp_path / "from-file.db"
    settings = tmp_path / "quota-ledger.env"
    settings.write_text(f"QUOTA_LEDGER_DB=sqlite:///{target}\nQUOTA_LEDGER_DEFAULT_TTL=42\n")
    ok(cli("db", "upgrade", "--settings", str(settings), cwd=tmp_path))
    assert target.exists()
    reserve = ("reserve", "root.a", "fpga=1", "--json", "--settings", str(settings))
    made = json.loads(ok(cli(*reserve, cwd=tmp_path)))
    created = datetime.fromisoformat(made["created_at"])
    assert (datetime.fromisoformat(made["expires_at"]) - created).total_seconds() == 42
