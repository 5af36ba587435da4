"""The runnable examples (shown in docs/kubernetes.md and docs/openstack.md) run on every backend and
print what the docs say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy.engine import URL

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(name: str, db_url: URL) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), db_url.render_as_string(hide_password=False)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_user_story_1_runs(db_url: URL) -> None:
    out = run("kube_story_1.py", db_url).splitlines()
    assert out[0].startswith("refused: namespace kube-system: insufficient quota to match these scopes")
    assert out[1].startswith("admitted: root.kube-system")
    assert "'used': {'pods': '1', 'requests.cpu': '250m'}" in out[2]
    assert out[3].startswith("refused: namespace default")


def test_user_story_2_runs(db_url: URL) -> None:
    out = run("kube_story_2.py", db_url).splitlines()
    assert (
        out[0] == "refused: pods in quota analytics/prioritized: limit 2, in use 2, reserved 0, requested 1, "
        "available 0"
    )
    assert "'used': {'pods': '2', 'requests.cpu': '1', 'requests.memory': '2Gi'}" in out[1]
    assert out[2] == "after release: {'pods': '1', 'requests.cpu': '500m', 'requests.memory': '1Gi'}"


def test_user_story_1_runs_as_the_readme_writes_it() -> None:
    # `source .venv/bin/activate` (or a pip install) puts the package's python first on PATH;
    # then `python examples/kube_story_1.py` runs with no argument, on a throw-away SQLite file.
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["VIRTUAL_ENV"] = str(venv_bin.parent)
    result = subprocess.run(
        ["python", "examples/kube_story_1.py"],
        cwd=EXAMPLES.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].startswith("admitted: root.kube-system")


def test_openstack_cyborg_example_admits_no_claim_over_the_limit(db_url: URL) -> None:
    out = run("openstack_cyborg.py", db_url).splitlines()
    assert out[:4] == [
        "3 fpgas attached: fpga limit 5, used 3, reserved 0",
        "two requests reserved: fpga limit 5, used 3, reserved 2",
        "attachments done: fpga limit 5, used 5, reserved 0",
        "one more request refused: Resource fpga is over limit of 5 due to current usage 5 and delta 1",
    ]
    assert out[-2] == (
        "ledger claims, 16 requests at once: 5 admitted and created, 11 refused before creating anything"
    )
    measured = json.loads(out[-1])
    assert measured["ledger_over_admitted"] == 0
    # checked at once, the 16 requests all pass oslo.limit's check before any is created
    assert measured["oslo_limit_over_admitted"] > 0
