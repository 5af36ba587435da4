"""``reserve --wait`` waits in line for capacity on a ledger file; ``waiting`` lists the line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from test_cli import cli, ok

from quota_ledger import QuotaEngine

CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            resources: {max: {vcore: 4}}
"""


def test_reserve_waits_in_line_and_the_line_is_listed(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    ok(cli("db", "upgrade", db=db))
    (tmp_path / "queues.yaml").write_text(CONFIG)
    ok(cli("config", "apply", str(tmp_path / "queues.yaml"), db=db))
    holder = json.loads(ok(cli("reserve", "root.dev", "vcore=3", "--json", db=db)))
    assert ok(cli("waiting", db=db)).strip() == "nobody waits in partition default"
    timed_out = cli("reserve", "root.dev", "vcore=2", "--wait", "1s", db=db)
    assert timed_out.returncode == 3
    assert timed_out.stderr.startswith("error: waited in vain for capacity: over quota: vcore at root.dev")
    bad = cli("reserve", "root.dev", "vcore=2", "--priority", "3", db=db)
    assert bad.returncode == 2
    with QuotaEngine.from_url(db) as engine:
        waiting = engine.reserve("root.dev", {"vcore": "2"}, wait=60, block=False, priority=5)
    listed = ok(cli("waiting", "root.dev", db=db))
    assert listed.splitlines()[0].split() == ["POS", "ID", "PRIORITY", "QUEUE", "NEEDS", "SINCE", "UNTIL"]
    assert listed.splitlines()[1].split()[:5] == ["1", waiting.id[:8], "5", "root.dev", "vcore=2"]
    would = cli("reserve", "root.dev", "vcore=2", "--dry-run", "--wait", "1m", "--priority", "5", db=db)
    assert would.returncode == 3
    assert would.stdout.splitlines()[0] == (
        "would wait in line: it joins behind the requests that wait; 1 request ahead of it, needing vcore=2"
    )
    as_json = json.loads(ok(cli("waiting", "--json", db=db)))
    assert [(w["id"], w["position"]) for w in as_json] == [(waiting.id, 1)]
    # a blocked reserve in another process is granted when the holder is rolled back
    command = [
        sys.executable,
        "-m",
        "quota_ledger.cli",
        "reserve",
        "root.dev",
        "vcore=1",
        "--wait",
        "60s",
        "--json",
    ]
    env = {**os.environ, "QUOTA_LEDGER_DB": db}
    blocked = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    time.sleep(1.0)
    ok(cli("rollback", holder["id"], db=db))
    out, _ = blocked.communicate(timeout=60)
    assert blocked.returncode == 0
    assert json.loads(out)["state"] == "pending"
    shown = json.loads(ok(cli("show", waiting.id, "--json", db=db)))
    assert shown["state"] == "pending"  # granted first: a higher priority
