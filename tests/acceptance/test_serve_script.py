"""``scripts/serve``, the README's first command: what it does on a first and on a later start."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        list(args), capture_output=True, text=True, cwd=REPO, env=env, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _printed(output: str, name: str) -> str:
    """The token printed on the line after the one that names ``name``."""
    lines = output.splitlines()
    label = next(i for i, line in enumerate(lines) if line.startswith("# the ") and f"'{name}'" in line)
    return lines[label + 1]


def test_a_restart_keeps_the_configuration_and_replaces_the_tokens(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    env = {**os.environ, "QUOTA_LEDGER_DB": f"sqlite:///{ledger}"}
    cli = (sys.executable, "-m", "quota_ledger.cli")

    first = run("scripts/serve", "--check", env=env)
    assert f"# data lives in {ledger}" in first
    assert "# a new ledger: applied examples/queues.yaml" in first
    assert "service check: ready, signed in as serve-reader, dashboard served" in first
    # The dashboard's way in is the reader token, signed in on the form: no token in the URL.
    assert re.search(r"^# open the dashboard:  http://127\.0\.0\.1:\d+/ui   and sign in", first, re.M)
    assert "?token=" not in first
    run(*cli, "limits", "set", "root.prod", "vcore=12", env=env)
    version = json.loads(run(*cli, "config", "show", "--json", env=env))["version"]

    second = run("scripts/serve", "--check", env=env)
    assert f"# configuration version {version} in force, kept" in second
    assert "applied examples/queues.yaml" not in second
    limits = json.loads(run(*cli, "limits", "show", "root.prod", "--json", env=env))
    assert limits["root.prod"]["vcore"] == 12000  # the limit changed between the starts
    tokens = json.loads(run(*cli, "tokens", "list", "--json", env=env))
    assert sorted((t["name"], t["role"], t["revoked_at"]) for t in tokens) == [
        ("serve-admin", "admin", None),
        ("serve-reader", "reader", None),
    ]
    for name in ("serve-admin", "serve-reader"):
        first_token, second_token = _printed(first, name), _printed(second, name)
        assert first_token.startswith("qlt_")
        assert second_token.startswith("qlt_")
        assert first_token != second_token
