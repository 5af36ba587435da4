"""``reserve`` warns about a resource or a queue no configuration knows (a likely typo)."""

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
            resources: {max: {nvidia.com/gpu: 4, vcore: 8}}
"""


def test_reserve_warns_about_an_unknown_resource_and_queue(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    ok(cli("db", "upgrade", db=db))
    (tmp_path / "queues.yaml").write_text(CONFIG)
    ok(cli("config", "apply", str(tmp_path / "queues.yaml"), db=db))
    gpus = cli("reserve", "root.dev", "gpus=1", db=db)
    assert gpus.returncode == 0
    said = "`gpus` is not limited anywhere in partition default; did you mean `nvidia.com/gpu`?"
    assert said in gpus.stderr
    nope = cli("reserve", "root.nope", "vcore=1", "--json", db=db)
    assert json.loads(nope.stdout)["warnings"] == [
        "`root.nope` is a new queue with no limits; did you mean `root.dev`?"
    ]
    assert "did you mean `root.dev`?" in nope.stderr
    fine = cli("reserve", "root.dev", "vcore=1", db=db)
    assert fine.returncode == 0
    assert "warning" not in fine.stderr


def test_a_fraction_of_a_whole_unit_is_refused_as_python_and_http_refuse_it(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    ok(cli("db", "upgrade", db=db))
    refused = cli("reserve", "root.a", "fpga=1.5", db=db)
    assert refused.returncode == 1
    assert "fpga is counted in whole units" in refused.stderr
