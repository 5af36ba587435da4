"""scripts/bench's ``cli`` case: chosen by ``--cli`` or ``--cases cli`` alone (no server needed),
and reported as medians beside their targets. The timing itself is the benchmark's, not a test's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

# scripts/ is not on the path of the tests: the benchmark package is imported from there
from benchmarks import report
from benchmarks.cases import cli
from benchmarks.settings import parse_args, select_cases


def test_cli_is_a_case_of_its_own_that_a_flag_adds() -> None:
    assert select_cases("cli", "", http=False) == ["cli"]
    assert select_cases("default", "", http=False, cli=True)[-1] == "cli"
    assert "cli" not in select_cases("default", "", http=False)
    _, cfg = parse_args(["--cases", "cli"])
    assert cfg is not None
    assert cfg.cases == ["cli"]


def test_the_report_gives_each_command_its_median_beside_its_target() -> None:
    found = {
        "command": "/venv/bin/quota-ledger",
        "runs": 5,
        "bytecode_cached": False,
        "load_average": 1.0,
        "commands": {
            "--help": {"seconds": [0.1, 0.2, 0.12, 0.11, 0.3], "median": 0.12, "target": 0.25},
            "usage": {"seconds": [0.5] * 5, "median": 0.5, "target": 0.4},
        },
    }
    lines = cli.section(found)
    assert "PYTHONDONTWRITEBYTECODE set" in lines[1]
    assert "| `quota-ledger --help` | 0.120 | < 0.25 s ✓ |" in "\n".join(lines)
    assert "| `quota-ledger --db sqlite:///… usage` | 0.500 | < 0.4 s ✗ |" in "\n".join(lines)
    assert "bytecode compiled first" in cli.section({**found, "bytecode_cached": True})[1]
    assert set(cli.COMMANDS) == {"--help", "--version", "usage"}
    assert cli.RUNS == 5
    assert report.cli is cli
