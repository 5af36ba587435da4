"""deploy/Containerfile, read as a builder reads it (no container engine runs here): two stages,
the runtime dependencies only, at the versions of constraints.txt; a numeric non-root user that
the manifests run as; nothing written outside /tmp and the data directory; `quota-ledger serve`
by default."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    argument: str


def _instructions(text: str) -> list[Instruction]:
    """The instructions, continuation lines joined and comments dropped."""
    found: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, argument = whole.partition(" ")
        found.append(Instruction(keyword.upper(), argument.strip()))
    assert not pending, "a continuation line ends the file"
    return found


def _stages() -> list[list[Instruction]]:
    stages: list[list[Instruction]] = []
    for instruction in _instructions(CONTAINERFILE.read_text()):
        if instruction.keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _runtime() -> list[Instruction]:
    return _stages()[-1]


def _env(stage: list[Instruction]) -> dict[str, str]:
    values: dict[str, str] = {}
    for instruction in stage:
        if instruction.keyword == "ENV":
            for word in shlex.split(instruction.argument):
                name, _, value = word.partition("=")
                values[name] = value
    return values


def _all(keyword: str, stage: list[Instruction] | None = None) -> list[str]:
    chosen = stage if stage is not None else _instructions(CONTAINERFILE.read_text())
    return [i.argument for i in chosen if i.keyword == keyword]


def test_the_parser_joins_continuations_and_drops_comments() -> None:
    parsed = _instructions("# c\nFROM x AS a\nRUN a \\\n    && b\n\nUSER 1\n")
    assert parsed == [Instruction("FROM", "x AS a"), Instruction("RUN", "a && b"), Instruction("USER", "1")]


def test_it_builds_in_one_stage_and_runs_in_another_from_the_same_base() -> None:
    stages = _stages()
    assert len(stages) >= 2
    assert stages[0][0].argument.endswith(" AS build")
    assert stages[-1][0].argument == "${PYTHON_IMAGE}"
    assert stages[0][0].argument.split()[0] == "${PYTHON_IMAGE}"  # the venv's interpreter path holds
    assert any(copy.startswith("--from=build ") for copy in _all("COPY", stages[-1]))


def test_it_installs_the_package_with_the_runtime_dependencies_pinned_by_constraints() -> None:
    installs = [
        command
        for run in _all("RUN")
        for command in run.split("&&")
        if re.search(r"\bpip install\b", command)
    ]
    assert installs, "no pip install"
    for command in installs:
        words = shlex.split(command)
        assert words[words.index("-c") + 1] == "constraints.txt"
        # the project itself, with the reconciler's client (the kubernetes extra) and no other
        # extra, which would bring test or docs packages in
        assert words[-1] == ".[kubernetes]"
        assert not any("[" in word for word in words[:-1])
    assert "constraints.txt" in " ".join(_all("COPY", _stages()[0]))


def test_the_build_context_copies_only_files_that_exist() -> None:
    for copy in _all("COPY"):
        words = copy.split()
        if words[0].startswith("--from="):
            continue
        for source in words[:-1]:
            assert (ROOT / source).exists(), source


def test_it_runs_as_a_numeric_non_root_user_the_manifests_agree_on() -> None:
    (user,) = _all("USER", _runtime())
    assert re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", user), f"USER {user} is not a numeric non-root id"
    uid, _, gid = user.partition(":")
    manifest = yaml.safe_load((ROOT / "deploy/kubernetes/deployment.yaml").read_text())
    pod = manifest["spec"]["template"]["spec"]["securityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"]) == (int(uid), int(gid))
    # the data directory (a SQLite ledger) belongs to that user; everything else is read-only
    assert any(f"chown {user} " in run for run in _all("RUN", _runtime()))


def test_nothing_is_written_outside_tmp_and_the_data_directory() -> None:
    env = _env(_runtime())
    assert env["HOME"] == env["TMPDIR"] == "/tmp"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["XDG_DATA_HOME"] == "/var/lib"  # the default SQLite ledger: /var/lib/quota-ledger
    assert env["PATH"].startswith("/opt/quota-ledger/bin:")
    assert any("mkdir -p /var/lib/quota-ledger" in run for run in _all("RUN", _runtime()))


def test_it_serves_by_default_and_leaves_health_to_the_orchestrators_probes() -> None:
    (entrypoint,) = _all("ENTRYPOINT", _runtime())
    (command,) = _all("CMD", _runtime())
    assert json.loads(entrypoint) + json.loads(command) == ["quota-ledger", "serve"]
    assert _env(_runtime())["QUOTA_LEDGER_HOST"] == "0.0.0.0"  # reachable from outside the container
    # Kubernetes ignores HEALTHCHECK and probes /readyz itself; the service may speak HTTP or HTTPS
    assert _all("HEALTHCHECK") == []


def test_the_build_context_leaves_out_the_virtual_environment_and_the_history() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)
