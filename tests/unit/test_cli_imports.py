"""The command line reads its arguments before it loads the ledger: building the parser, and
``--help``, import none of the packages that make a command slow to start (SQLAlchemy, pydantic,
PyYAML, httpx, alembic, psycopg). Each is checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: what start-up must not import before a command runs
HEAVY = ("sqlalchemy", "pydantic", "pydantic_settings", "yaml", "httpx", "alembic", "psycopg", "rich")
#: ``quota-ledger ARGS`` in-process; ``--help`` and a bad option exit
RUN = "from quota_ledger.cli import main\ntry:\n    main({args!r})\nexcept SystemExit:\n    pass"


def loaded_after(code: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "code",
    [
        "import quota_ledger",
        "import quota_ledger.cli.parser",
        "from quota_ledger.cli import parser; parser.build()",
        "from quota_ledger.cli import main",
        RUN.format(args=["--help"]),
        RUN.format(args=["reserve", "--help"]),
        RUN.format(args=["--no-such-option"]),
    ],
    ids=["package", "parser module", "parser", "main", "--help", "reserve --help", "bad option"],
)
def test_reading_the_command_line_imports_nothing_heavy(code: str) -> None:
    assert loaded_after(code).isdisjoint(HEAVY)


def test_the_package_still_offers_its_names_when_asked() -> None:
    import quota_ledger

    assert quota_ledger.QuotaEngine.__name__ == "QuotaEngine"
    assert quota_ledger.OverQuota.__module__ == "quota_ledger.model.errors"
    assert set(quota_ledger.__all__) <= set(dir(quota_ledger))
    with pytest.raises(AttributeError):
        _ = quota_ledger.NoSuchName


def test_a_command_on_a_database_loads_no_service_client(tmp_path: Path) -> None:
    """``--db ... usage`` draws the queue tree from the database: neither httpx nor the
    service's client module is loaded to tell which kind of ledger it has."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    code = (
        RUN.format(args=["--db", url, "usage"])
        + "\nimport sys\nassert 'quota_ledger.cli.remote' not in sys.modules"
    )
    loaded = loaded_after(code)
    assert "sqlalchemy" in loaded  # the command ran on the database
    assert "httpx" not in loaded
