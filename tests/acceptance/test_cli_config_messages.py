"""What ``config`` and ``--db`` say about a mistake: enough to act on."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli import cli, ok

LIMITED = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: a
            resources: {max: {vcore: %s}}
"""


def _ledger(tmp_path: Path) -> str:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    ok(cli("db", "upgrade", db=db))
    return db


def test_validate_refuses_an_empty_file_as_apply_does(tmp_path: Path) -> None:
    db = _ledger(tmp_path)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert "configuration is valid" in ok(cli("config", "validate", str(empty), db=db))
    (tmp_path / "limits.yaml").write_text(LIMITED % 4)
    ok(cli("config", "apply", str(tmp_path / "limits.yaml"), db=db))
    validated = cli("config", "validate", str(empty), db=db)
    applied = cli("config", "apply", str(empty), db=db)
    assert validated.returncode == applied.returncode == 1
    assert "the document is empty" in validated.stdout
    assert "the document is empty" in applied.stderr


def test_document_problems_carry_no_empty_partition_and_queues_needs_partitions(tmp_path: Path) -> None:
    db = _ledger(tmp_path)
    broken = tmp_path / "broken.yaml"
    broken.write_text("partitions:\n  - name: default\n   queues: [\n")
    said = cli("config", "validate", str(broken), db=db).stdout
    assert "invalid YAML at line" in said
    assert "partition ''" not in said
    flat = tmp_path / "flat.yaml"
    flat.write_text("queues:\n  - name: root\n")
    said = cli("config", "validate", str(flat), db=db).stdout
    assert "partitions:" in said
    assert "partition ''" not in said


def test_a_file_name_given_as_db_is_shown_its_url(tmp_path: Path) -> None:
    result = cli("--db", "ledger.db", "usage", cwd=tmp_path)
    assert result.returncode == 1
    assert "sqlite:///ledger.db" in result.stderr


def test_apply_names_who_the_change_puts_over_a_limit(tmp_path: Path) -> None:
    db = _ledger(tmp_path)
    (tmp_path / "four.yaml").write_text(LIMITED % 4)
    (tmp_path / "one.yaml").write_text(LIMITED % 1)
    ok(cli("config", "apply", str(tmp_path / "four.yaml"), db=db))
    ok(cli("reserve", "root.a", "vcore=3", db=db))
    said = ok(cli("config", "apply", str(tmp_path / "one.yaml"), db=db))
    assert "applied configuration version 2" in said
    assert "queue root.a" in said
    assert "over their limit" in said
    back = json.loads(ok(cli("config", "apply", str(tmp_path / "four.yaml"), "--json", db=db)))
    assert back == {"version": 3, "over_limit": []}
