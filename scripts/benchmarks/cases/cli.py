"""Start-up of the ``quota-ledger`` command: ``--help``, ``--version`` and ``usage`` on a fresh
SQLite ledger, each run :data:`RUNS` times as a new process, the median wall time beside its
target (``--help`` and ``--version`` < 0.25 s, ``usage`` < 0.4 s). Needs no database server.

The command is the console script next to this python (``python -m quota_ledger.cli`` without
one), run without any ``QUOTA_LEDGER_*`` variable. It runs with bytecode caches as a user has them
after ``pip install``: the package's sources are compiled first (``compileall``, which pip runs
on what it installs; an editable install's sources are not, and neither are any while
``PYTHONDONTWRITEBYTECODE`` is set), and the commands run without ``PYTHONDONTWRITEBYTECODE``,
so a module still uncompiled is cached by its first import. Every run is timed, none dropped: the
first also pays for a cold file cache, as a user's first command of the day does."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import BenchError, log, median

#: runs of each command; the median is reported
RUNS = 5
#: the commands, by name, with their arguments after the global ones, and their targets (seconds)
COMMANDS: dict[str, tuple[tuple[str, ...], float]] = {
    "--help": (("--help",), 0.25),
    "--version": (("--version",), 0.25),
    "usage": (("usage",), 0.4),
}


def command() -> list[str]:
    """How this environment runs ``quota-ledger``."""
    script = Path(sys.executable).with_name("quota-ledger")
    return [str(script)] if script.exists() else [sys.executable, "-m", "quota_ledger.cli"]


def run(_cfg: object = None) -> dict[str, Any]:
    """Each command's wall times (seconds), median and target."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("QUOTA_LEDGER_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    base = command()
    compiled = compile_package(env, script=len(base) == 1)
    results: dict[str, Any] = {
        "command": " ".join(base),
        "runs": RUNS,
        # the package's bytecode written before the runs, as pip install writes it
        "bytecode_cached": True,
        "compiled": compiled,
        # a shared machine's other work moves these figures more than anything else
        "load_average": os.getloadavg()[0],
        "commands": {},
    }
    with tempfile.TemporaryDirectory(prefix="ql_bench_cli_") as tmp:
        db = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        _timed([*base, "--db", db, "db", "upgrade"], env)
        for name, (args, target) in COMMANDS.items():
            log(f"cli: {name}, {RUNS} runs")
            argv = [*base, *args] if name.startswith("-") else [*base, "--db", db, *args]
            times = [_timed(argv, env) for _ in range(RUNS)]
            results["commands"][name] = {"seconds": times, "median": median(times), "target": target}
    return results


def compile_package(env: dict[str, str], *, script: bool) -> str:
    """Write the bytecode of the ``quota_ledger`` the command imports, as ``pip install`` does
    for the packages it installs; the directory compiled. A console ``script`` does not look in
    the current directory first (``-P``), as ``python -m`` does."""
    where = "import quota_ledger, os; print(os.path.dirname(quota_ledger.__file__))"
    found = subprocess.run(
        [sys.executable, *(["-P"] if script else []), "-c", where],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if found.returncode != 0:
        raise BenchError(f"cannot find quota_ledger: {found.stderr.strip()[-500:]}")
    package = found.stdout.strip()
    done = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", package],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"compileall {package} exited {done.returncode}: {done.stdout.strip()[-500:]}")
    return package


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    spent = time.perf_counter() - started
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return spent


def section(result: dict[str, Any]) -> list[str]:
    """The report's table: each command's median, its target, and every run."""
    # an older run's result may hold runs that compiled every source, PYTHONDONTWRITEBYTECODE set
    cached = (
        "; bytecode compiled first, as pip install does"
        if result["bytecode_cached"]
        else "; PYTHONDONTWRITEBYTECODE set: sources compiled every run"
    )
    lines = [
        "",
        f"### command-line start-up: median of {result['runs']} runs, each a new process "
        f"(`{Path(result['command'].split()[0]).name}`{cached}; load average "
        f"{result['load_average']:.1f} at the start)",
        "",
        "| command | median s | target | every run, s |",
        "|---|--:|--:|---|",
    ]
    for name, found in result["commands"].items():
        ok = "✓" if found["median"] < found["target"] else "✗"
        runs = ", ".join(f"{t:.3f}" for t in found["seconds"])
        shown = f"quota-ledger {name}" if name.startswith("-") else f"quota-ledger --db sqlite:///… {name}"
        lines.append(f"| `{shown}` | {found['median']:.3f} | < {found['target']:g} s {ok} | {runs} |")
    return lines
