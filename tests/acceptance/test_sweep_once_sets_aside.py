"""``quota-ledger sweep --once`` with a reservation that cannot be expired: the rest expire, and
the command names the one it left and exits 1."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from quota_ledger import QuotaEngine, ReservationState

EXIT_ERROR = 1


def test_sweep_once_expires_the_rest_and_names_what_it_could_not_expire(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    db = f"sqlite:///{path}"
    with QuotaEngine.from_url(db) as ledger:
        ledger.migrate()
        bad = ledger.reserve("root.bad", {"fpga": 5}, ttl=0.1).id
        good = [ledger.reserve("root.ok", {"fpga": 1}, ttl=0.2).id for _ in range(3)]
    with sqlite3.connect(path) as conn:  # below what the reservation holds: expiring it is refused
        conn.execute("UPDATE quota_usages SET reserved = 0 WHERE scope = 'root.bad'")
    time.sleep(0.3)
    swept = subprocess.run(
        [sys.executable, "-m", "quota_ledger.cli", "sweep", "--once", "--batch-size", "2", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "QUOTA_LEDGER_DB": db},
        timeout=120,
        check=False,
    )
    assert swept.returncode == EXIT_ERROR, swept.stderr
    assert json.loads(swept.stdout) == {"expired": len(good), "set_aside": [bad]}
    assert bad in swept.stderr  # logged, with the error in the database's words
    assert "CHECK constraint failed" in swept.stderr
    with QuotaEngine.from_url(db) as ledger:
        assert ledger.get(bad).state is ReservationState.PENDING
        assert {ledger.get(rid).state for rid in good} == {ReservationState.EXPIRED}
