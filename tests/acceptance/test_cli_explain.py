"""``reserve --dry-run`` says what a reserve would decide and writes nothing; a refusal names the
limits that stop it and who holds what they count, in each resource's units."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli import cli, ok

CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            resources: {max: {memory: 8Gi, vcore: 8}}
"""


def test_a_dry_run_and_a_refusal_explain_themselves(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    ok(cli("db", "upgrade", db=db))
    (tmp_path / "queues.yaml").write_text(CONFIG)
    ok(cli("config", "apply", str(tmp_path / "queues.yaml"), db=db))
    ok(cli("reserve", "root.dev", "memory=5Gi", "--user", "sue", "--application", "train", db=db))
    fits = cli("reserve", "root.dev", "memory=3Gi", "--dry-run", db=db)
    assert (fits.returncode, fits.stdout.strip()) == (0, "would be admitted now")
    over = cli("reserve", "root.dev", "memory=4Gi", "vcore=1", "--dry-run", db=db)
    assert over.returncode == 3
    assert over.stdout.splitlines() == [
        "would be refused: 1 limit stops it",
        "  memory at root.dev: limit 8Gi, in use 0, reserved 5Gi, requested 4Gi, available 3Gi; short by 1Gi",
        "    largest holders:",
        "      application train in root.dev: 5Gi (in use 0, reserved 5Gi)",
    ]
    as_json = json.loads(cli("reserve", "root.dev", "memory=4Gi", "--dry-run", "--json", db=db).stdout)
    assert as_json["admitted"] is False
    assert as_json["blockers"][0]["holders"][0]["name"] == "train"
    assert as_json["violations"][0]["shortfall"] == 1 << 30
    listed = json.loads(cli("reservations", "--json", db=db).stdout)
    assert len(listed["reservations"]) == 1  # the dry runs wrote nothing
    refused = cli("reserve", "root.dev", "memory=4Gi", db=db)
    assert refused.returncode == 3
    assert refused.stderr.splitlines()[0].startswith("error: over quota: memory at root.dev")
    assert "application train in root.dev: 5Gi (in use 0, reserved 5Gi)" in refused.stderr
