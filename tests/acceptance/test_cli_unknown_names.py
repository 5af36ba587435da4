"""``limits set`` warns about a likely typo as ``reserve`` does; a partition with
``unknownnames: refuse`` makes both refuse it (exit 1) and change nothing."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli import cli, ok

CONFIG = """
partitions:
  - name: default
    unknownnames: {setting}
    queues:
      - name: root
        queues:
          - name: dev
            resources: {{max: {{nvidia.com/gpu: 4, vcore: 8}}}}
"""


def _ledger(tmp_path: Path, setting: str) -> str:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    ok(cli("db", "upgrade", db=db))
    (tmp_path / "queues.yaml").write_text(CONFIG.format(setting=setting))
    ok(cli("config", "apply", str(tmp_path / "queues.yaml"), db=db))
    return db


def test_limits_set_warns_about_a_resource_close_to_a_limited_one(tmp_path: Path) -> None:
    db = _ledger(tmp_path, "warn")
    typo = cli("limits", "set", "root.dev", "vcores=10", db=db)
    assert typo.returncode == 0, typo.stderr
    said = "warning: `vcores` is not limited anywhere in partition default; did you mean `vcore`?"
    assert said in typo.stderr
    assert "vcores" in typo.stdout
    queue = cli("limits", "set", "root.dve", "vcore=1", "--json", db=db)
    assert "warning: `root.dve` is a new queue; did you mean `root.dev`?" in queue.stderr
    assert json.loads(queue.stdout)["root.dve"] == {"vcore": 1000}
    fine = cli("limits", "set", "root.dev", "vcore=6", db=db)
    assert "warning" not in fine.stderr


def test_a_refusing_partition_refuses_a_typo_and_changes_nothing(tmp_path: Path) -> None:
    db = _ledger(tmp_path, "refuse")
    limits = cli("limits", "set", "root.dev", "vcores=10", db=db)
    assert limits.returncode == 1
    assert "did you mean `vcore`?; partition default refuses unknown names" in limits.stderr
    reserve = cli("reserve", "root.nope", "vcore=1", db=db)
    assert reserve.returncode == 1
    assert "`root.nope` is a new queue with no limits; did you mean `root.dev`?" in reserve.stderr
    assert json.loads(ok(cli("limits", "show", "--json", db=db))) == {
        "root.dev": {"nvidia.com/gpu": 4, "vcore": 8000}
    }
