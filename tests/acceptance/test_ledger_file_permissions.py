"""A SQLite ledger the CLI or the service creates is readable by its owner only: it holds the
tokens' digests and everyone's usage."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path


def test_a_new_sqlite_ledger_and_its_directory_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTA_LEDGER_")}
    env["XDG_DATA_HOME"] = str(data)
    old_umask = os.umask(0o022)  # what most shells have: files 0644 unless the program says
    try:
        done = subprocess.run(
            [sys.executable, "-m", "quota_ledger.cli", "db", "upgrade"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.umask(old_umask)
    assert done.returncode == 0, done.stderr
    ledger = data / "quota-ledger" / "ledger.db"
    assert stat.S_IMODE(ledger.stat().st_mode) == 0o600
    assert stat.S_IMODE(ledger.parent.stat().st_mode) == 0o700
    assert ledger.stat().st_size > 0  # migrated: the file was made first, then filled


def test_an_existing_ledger_keeps_its_permissions(tmp_path: Path) -> None:
    ledger = tmp_path / "shared.db"
    ledger.touch(mode=0o640)
    ledger.chmod(0o640)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTA_LEDGER_")}
    env["QUOTA_LEDGER_DB"] = f"sqlite:///{ledger}"
    done = subprocess.run(
        [sys.executable, "-m", "quota_ledger.cli", "db", "upgrade"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(ledger.stat().st_mode) == 0o640
