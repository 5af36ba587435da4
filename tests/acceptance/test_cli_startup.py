"""The command line starts without the packages only some commands use: alembic (the ``db``
commands), uvicorn and FastAPI (``serve``), httpx (``--url``) and rich (a progress bar on a
terminal). Each of them adds to the start-up time of every other command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: imported by the commands that use them, never at start-up
LATE = ("alembic", "uvicorn", "fastapi", "starlette", "httpx", "rich")

RUN = """
import json, sys
from quota_ledger.cli import main
try:
    main(sys.argv[1:])
except SystemExit:  # --help
    pass
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def loaded_by(tmp_path: Path, *args: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after running ``quota-ledger ARGS``."""
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    result = subprocess.run(
        [sys.executable, "-c", RUN, "--db", db, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    loaded_by(tmp_path, "db", "upgrade")
    return tmp_path


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("--version",),
        ("usage", "root"),
        ("limits", "show"),
        ("reserve", "root.a", "vcore=1"),
        ("audit",),
    ],
)
def test_commands_start_without_the_packages_of_other_commands(ledger: Path, args: tuple[str, ...]) -> None:
    assert loaded_by(ledger, *args).isdisjoint(LATE)


def test_the_db_commands_load_alembic_when_they_run(ledger: Path) -> None:
    assert "alembic" in loaded_by(ledger, "db", "current")


def test_version_prints_the_installed_version_without_reading_it_at_start_up() -> None:
    from importlib import metadata

    import quota_ledger

    result = subprocess.run(
        [sys.executable, "-m", "quota_ledger.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, f"quota-ledger {metadata.version('quota-ledger')}\n")
    assert quota_ledger.__version__ == metadata.version("quota-ledger")
    # read when asked for (the lookup scans the environment), not when the package is imported
    probe = "import quota_ledger; print('__version__' in vars(quota_ledger))"
    lazy = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert lazy.stdout.strip() == "False"


@pytest.mark.parametrize("args", [("usage",), ("reserve", "root.a", "vcore=1"), ("limits", "show")])
def test_a_sqlite_ledger_does_not_load_the_postgresql_driver(ledger: Path, args: tuple[str, ...]) -> None:
    assert "psycopg" not in loaded_by(ledger, *args)


def test_the_garbage_collector_rests_while_the_ledger_opens_and_runs_for_the_command(tmp_path: Path) -> None:
    probe = """
import gc, sys
from quota_ledger.cli import ledger_commands, main
from quota_ledger.engine import QuotaEngine

seen = []
opening, show = QuotaEngine.from_url.__func__, ledger_commands._usage
QuotaEngine.from_url = classmethod(lambda cls, *a, **k: seen.append(gc.isenabled()) or opening(cls, *a, **k))
ledger_commands._usage = lambda *a: seen.append(gc.isenabled()) or show(*a)
code = main(sys.argv[1:])
print(seen, gc.isenabled(), code)
"""
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    subprocess.run(
        [sys.executable, "-m", "quota_ledger.cli", "--db", db, "db", "upgrade"], check=True, timeout=120
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, "--db", db, "usage"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.stdout.splitlines()[-1] == "[False, True] True 0", result.stderr


def test_the_objects_of_the_ledger_modules_stay_frozen_while_the_command_runs_and_at_exit(
    tmp_path: Path,
) -> None:
    """The objects the ledger's modules made are frozen (gc.freeze) while the command runs, so the
    collector's first run does not walk them all; ``main`` unfreezes them for its caller, the
    ``quota-ledger`` program (``console_main``) leaves them frozen for the interpreter's exit."""
    probe = """
import gc, sys
from quota_ledger.cli import console_main, ledger_commands, main

seen = []
show = ledger_commands._usage
ledger_commands._usage = lambda *a: seen.append(gc.get_freeze_count() > 10_000) or show(*a)
code = main(sys.argv[1:])
after_main = gc.get_freeze_count()
program = console_main()  # the same command line, sys.argv's
print(seen, after_main, gc.get_freeze_count() > 10_000, code, program)
"""
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    subprocess.run(
        [sys.executable, "-m", "quota_ledger.cli", "--db", db, "db", "upgrade"], check=True, timeout=120
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, "--db", db, "usage"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.stdout.splitlines()[-1] == "[True, True] 0 True 0 0", result.stderr
