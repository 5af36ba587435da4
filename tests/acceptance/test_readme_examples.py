"""The README's examples run in order, as written, on a fresh ledger; so does docs/cli.md's transcript.

Every example runs with no ``QUOTA_LEDGER_*`` variable, ``XDG_DATA_HOME`` in a temporary directory
(so the default ledger is a new SQLite file there), the test's own environment first on ``PATH``
and, as working directory, a temporary directory holding a copy of ``examples/``.

README.md, block by block, in page order:

- "Two commands" (``scripts/serve``, ``scripts/test``): not run here. They install into the
  clone's ``.venv`` and run the whole suite; CI runs both in a fresh clone.
- "Installing" (``pip install``): not run; it would install into the environment under test.
  :func:`test_install_lines_install_from_the_clone` checks that no page installs from PyPI, where
  the package is not published, and ``scripts/build`` checks the package itself.
- "Where the data lives": a path, no command.
- ``export QUOTA_LEDGER_DB=postgresql://ledger@db.internal/ledger``: not run; it names a server of
  the reader's.
- "Reaching the CLI": run, with ``source .venv/bin/activate`` standing for the test's environment,
  which is already first on ``PATH``.
- The two Python blocks of the tour: run in one interpreter, in page order (the second continues
  the first); their output is not shown on the page, so only their success counts.
- The CLI transcript: every ``$ `` command runs in its own shell, one after the other on the same
  ledger. Where the page shows output under a command, the output (standard output and error)
  must be the same, reservation ids, times and the data directory aside. A command must exit 0,
  unless its comment says ``# exit code N`` or the output shown is an ``error:``. A reservation id
  (or a prefix of one) the page took from an earlier output is replaced by the id of this run.
- The service: ``scripts/serve`` is played by ``quota-ledger serve --port P`` on the same ledger
  with an admin token from ``quota-ledger tokens add``; the curl block then runs with that port
  and token in place of ``8080`` and ``qlt_...``, and must exit 0.

A bash block that runs runs under ``set -eo pipefail``: a command that fails there (where a reader
would stop) fails the test, and so does a traceback in its output. A bash block that none of
these rules names fails the test, so that a new one is either run or
named here with the reason it is not.

docs/cli.md: its transcript blocks (those of ``$ `` lines) run in page order as the README's, on
a fresh ledger of their own, which the page's first block migrates and gives
``examples/queues.yaml``. Not run: the progress bar (a picture of a terminal, no command), the
blocks of :data:`CLI_PAGE_BLOCKS_NOT_RUN` and the commands of :data:`CLI_PAGE_NOT_RUN`, each for
the reason given there.

The other pages' examples are not run here. docs/kubernetes.md's are ``examples/kube_story_*.py``,
which tests/acceptance/test_examples.py runs. The ``$ `` lines of docs/cli-reference.md,
docs/configuration-changes.md and docs/first-run.md are single outputs of the states their text
describes (a ledger with usage, a configuration file the page does not give, a ledger before
``db upgrade``), not a story to replay; the curl and Python snippets of the other pages need
values (tokens, ids, files) those pages leave to the reader.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLI_PAGE = ROOT / "docs" / "cli.md"
BLOCK = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
TIME = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")
TOKEN = re.compile(r"\bqlt_[\w-]+")
#: an application summary's times (ms since the epoch) and its resource x seconds, which the
#: time a run takes changes
SUMMARY_TIMES = re.compile(r'("\w+Time":\s*)\d+')
SUMMARY_USAGE = re.compile(r'("resourceUsage":\s*\{)[^}]*\}')
EXIT_CODE = re.compile(r"#\s*exit code (\d+)")
#: where the page shows the default ledger's directory ($XDG_DATA_HOME)
PAGE_DATA_HOME = "/home/ann/.local/share"

#: the bash blocks of the README that do not run here, by a line they start with, and why
README_NOT_RUN = {
    "scripts/serve   #": "installs into the clone's .venv and serves until stopped; CI runs it",
    "pip install": "installs into the environment under test; scripts/build checks the package",
    "export QUOTA_LEDGER_DB=postgresql://": "names a database server of the reader's",
    "scripts/serve                     #": "played by `quota-ledger serve` on a free port",
}

#: docs/cli.md's commands that do not run, and why
CLI_PAGE_NOT_RUN = {
    "quota-ledger commit abcd": "needs two reservations whose ids start alike, which ids are not made to",
    "quota-ledger sweep --interval 5 --max-rate 2000": "loops until Ctrl-C",
    "quota-ledger serve --port 8080": "serves until stopped; the README's service block runs it",
}

#: docs/cli.md's transcript blocks that do not run, by how they start, and why
CLI_PAGE_BLOCKS_NOT_RUN = {
    "$ quota-ledger audit\nPARTITION": "shows drift, which no command of the page makes",
    "$ quota-ledger openstack sync": "needs a Keystone; tests/openstack/test_keystone_sync.py runs "
    "the command, once and with --every, against a real one",
}


@dataclass
class Step:
    """One ``$ `` command of a transcript and what the page shows under it."""

    command: str
    shown: list[str] = field(default_factory=list)


def blocks(path: Path) -> list[tuple[str, str]]:
    """The fenced code blocks of a page, in order: (language, text)."""
    return [
        (match.group(2), textwrap.dedent(match.group(3)))
        for match in BLOCK.finditer(path.read_text(encoding="utf-8"))
    ]


def is_transcript(text: str) -> bool:
    return text.startswith("$ ")


def transcript(text: str) -> list[Step]:
    steps: list[Step] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append(Step(line[2:]))
        else:
            steps[-1].shown.append(line)
    return steps


def is_error(shown: list[str]) -> bool:
    """Whether the output a page shows is an error: an ``error:`` line, or the JSON of ``--json``."""
    return bool(shown) and (shown[0].startswith("error:") or shown[1:2] == ['  "error": "OverQuota",'])


def normalized(text: str, data_home: str) -> list[str]:
    text = text.replace(data_home, PAGE_DATA_HOME)
    text = TOKEN.sub("<token>", TIME.sub("<time>", UUID.sub("<id>", text)))
    text = SUMMARY_USAGE.sub(r"\1...}", SUMMARY_TIMES.sub(r"\1<ms>", text))
    return [line.rstrip() for line in text.rstrip("\n").splitlines()]


def same_output(made: list[str], shown: list[str]) -> bool:
    """Whether a command printed what the page shows; a line ``...`` there stands for the rest."""
    if shown and shown[-1].strip() == "...":
        return made[: len(shown) - 1] == shown[:-1]
    return made == shown


class Shell:
    """Runs a page's commands one after the other in the same directory and environment."""

    def __init__(self, tmp_path: Path) -> None:
        self.cwd = tmp_path / "work"
        shutil.copytree(ROOT / "examples", self.cwd / "examples")
        self.data_home = str(tmp_path / "data")
        env = {name: value for name, value in os.environ.items() if not name.startswith("QUOTA_LEDGER_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["XDG_DATA_HOME"] = self.data_home
        env["COLUMNS"] = "200"
        self.env = env
        self.ids: dict[str, str] = {}  # an id the page shows -> the id this run made
        self.last_code = 0

    def run(self, script: str, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run one command; `echo $?` then gives the exit code of the command before it."""
        return self._bash(f"(exit {self.last_code}); {script}", timeout)

    def run_block(self, script: str, *, timeout: float = 120) -> None:
        """Run a block of commands; any that fails, and any traceback, fails the test."""
        result = self._bash(f"set -eo pipefail\n{script}", timeout)
        assert result.returncode == 0, result.stdout
        assert "Traceback" not in result.stdout, result.stdout

    def _bash(self, script: str, timeout: float) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
        self.last_code = result.returncode
        return result

    def with_ids_of_this_run(self, command: str) -> str:
        """The command with each id (or id prefix) the page took from an earlier output replaced."""

        def replace(match: re.Match[str]) -> str:
            word = match.group(0)
            for shown, made in self.ids.items():
                if len(word) >= 4 and shown.startswith(word):
                    return made[: len(word)]
            return word

        return re.sub(r"(?<![\w-])[0-9a-f][0-9a-f-]{3,35}(?![\w-])", replace, command)

    def play(self, steps: list[Step], *, not_run: dict[str, str] | None = None) -> None:
        for step in steps:
            if any(step.command.startswith(skipped) for skipped in not_run or {}):
                continue
            command = self.with_ids_of_this_run(step.command)
            result = self.run(command)
            where = f"$ {step.command}\n{result.stdout}"
            code = EXIT_CODE.search(step.command)
            if code:
                assert result.returncode == int(code.group(1)), where
            elif is_error(step.shown):
                assert result.returncode != 0, where
            elif step.command != "echo $?":
                assert result.returncode == 0, where
            if step.shown:
                made = normalized(result.stdout, self.data_home)
                shown = normalized("\n".join(step.shown), self.data_home)
                assert same_output(made, shown), where
            self.ids.update(
                zip(UUID.findall("\n".join(step.shown)), UUID.findall(result.stdout), strict=False)
            )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_service(shell: Shell, port: int) -> subprocess.Popen[str]:
    service = subprocess.Popen(
        ["quota-ledger", "serve", "--port", str(port), "--access-log", "off"],
        cwd=shell.cwd,
        env=shell.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert service.poll() is None, service.communicate()[1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return service
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    service.kill()
    raise AssertionError("the service did not become ready")


def run_readme_shell_block(shell: Shell, text: str, port: int | None) -> None:
    first = text.splitlines()[0]
    if any(first.startswith(skipped) for skipped in README_NOT_RUN):
        return
    if first == "source .venv/bin/activate":
        shell.run_block(text.replace(first, ": the environment of the test is first on PATH", 1))
        return
    if first == "T=qlt_...":
        assert port is not None, "the service block comes after the one that starts the service"
        token = shell.run("quota-ledger tokens add readme --role admin").stdout.split()[0]
        script = text.replace("T=qlt_...", f"T={token}", 1).replace("localhost:8080", f"localhost:{port}")
        shell.run_block(script)
        return
    raise AssertionError(f"a README bash block this test does not know: {first!r}; run it, or say why not")


@pytest.mark.slow
def test_the_readme_examples_run_in_order_as_written(tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    page = blocks(README)
    python = "\n".join(text for language, text in page if language == "python")
    service: subprocess.Popen[str] | None = None
    port: int | None = None
    ran_python = False
    try:
        for language, text in page:
            if language == "python" and not ran_python:
                result = subprocess.run(
                    [sys.executable, "-c", python],
                    cwd=shell.cwd,
                    env=shell.env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                assert result.returncode == 0, result.stderr
                ran_python = True
            elif language == "" and is_transcript(text):
                shell.play(transcript(text))
            elif language == "bash":
                if text.startswith("scripts/serve                     #"):
                    port = free_port()
                    service = start_service(shell, port)
                run_readme_shell_block(shell, text, port)
        assert ran_python
        assert port is not None, "the README's service block ran"
    finally:
        if service is not None:
            service.terminate()
            service.wait(timeout=30)


def test_install_lines_install_from_the_clone() -> None:
    # quota-ledger is not on PyPI: `pip install quota-ledger` would fail, or install a stranger's.
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    from_pypi = [
        f"{page.name}: {match.group(0)}"
        for page in pages
        for match in re.finditer(
            r"pip install\s+['\"]?quota-ledger\b[^`\n]*", page.read_text(encoding="utf-8")
        )
    ]
    assert from_pypi == []


def test_the_transcript_check_compares_modulo_ids_and_times() -> None:
    shown = "5d43da85-cc59-48ae-8ae8-30aa73a5b00a pending\n  expires 2026-11-23T23:59:18+00:00  key k"
    made = "e93de54f-e21e-46d4-a6fc-66e6a850393f pending\n  expires 2026-11-27T07:23:45+00:00  key k\n"
    assert normalized(made, "/tmp/x") == normalized(shown, "/tmp/x")
    assert normalized(made.replace("pending", "committed"), "/tmp/x") != normalized(shown, "/tmp/x")


@pytest.mark.parametrize("first", list(README_NOT_RUN))
def test_every_block_the_readme_test_skips_is_still_on_the_page(first: str) -> None:
    assert any(text.startswith(first) for _, text in blocks(README))


@pytest.mark.slow
def test_the_cli_page_transcript_runs_in_order_as_written(tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    ran = 0
    for _, text in blocks(CLI_PAGE):
        if not is_transcript(text) or any(text.startswith(key) for key in CLI_PAGE_BLOCKS_NOT_RUN):
            continue
        shell.play(transcript(text), not_run=CLI_PAGE_NOT_RUN)
        ran += 1
    assert ran >= 10


@pytest.mark.parametrize("command", [*CLI_PAGE_NOT_RUN, *CLI_PAGE_BLOCKS_NOT_RUN])
def test_every_command_the_cli_page_test_skips_is_still_on_the_page(command: str) -> None:
    text = "\n".join(body for _, body in blocks(CLI_PAGE))
    assert command.removeprefix("$ ") in text
