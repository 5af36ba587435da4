"""What a person reads from the CLI: tables in each resource's own units, short reservation ids,
and a progress bar on a terminal only."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.cli import main
from quota_ledger.model.short_ids import MIN_PREFIX
from quota_ledger.runtime import tokens

EXIT_OVER_QUOTA = 3
CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            resources: {max: {vcore: 10, memory: 16Gi}}
            limits:
              - {users: [sue], maxresources: {vcore: 6, memory: 8Gi}, maxapplications: 2}
              - {groups: [dev], maxresources: {vcore: 8}}
"""


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


Cli = Callable[..., Result]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """The command in this process (a subprocess costs an interpreter start each)."""
    for name in [n for n in os.environ if n.startswith("QUOTA_LEDGER_")]:
        monkeypatch.delenv(name)

    def run(*args: str, db: URL | str) -> Result:
        url = db.render_as_string(hide_password=False) if isinstance(db, URL) else db
        capsys.readouterr()
        code = main(["--db", url, *args])
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


def ok(result: Result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


@pytest.fixture
def db(tmp_path: Path, cli: Cli) -> str:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    ok(cli("db", "upgrade", db=url))
    return url


def test_a_refusal_speaks_in_human_units_and_json_keeps_base_units(cli: Cli, db: str) -> None:
    ok(cli("limits", "set", "root.a", "memory=8Gi", db=db))
    refused = cli("reserve", "root.a", "memory=9Gi", db=db)
    assert refused.returncode == EXIT_OVER_QUOTA
    assert refused.stderr.splitlines() == [
        "error: over quota: memory at root.a: limit 8Gi, in use 0, reserved 0, requested 9Gi, available 8Gi",
        "  memory at root.a, short by 1Gi",
    ]
    as_json = json.loads(cli("reserve", "root.a", "memory=9Gi", "--json", db=db).stderr)
    assert as_json["violations"][0]["limit"] == 8 * 2**30
    assert as_json["violations"][0]["requested"] == 9 * 2**30


def test_users_and_groups_print_tables_with_limits(cli: Cli, db: str, tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text(CONFIG)
    ok(cli("config", "apply", str(tmp_path / "q.yaml"), db=db))
    ok(
        cli(
            "reserve",
            "root.dev",
            "vcore=500m",
            "memory=1Gi",
            "--user",
            "sue",
            "--group",
            "dev",
            "--application",
            "app-1",
            db=db,
        )
    )
    users = rows(ok(cli("users", db=db)))
    assert users[0] == ["USER", "QUEUE", "APPLICATIONS", "RESOURCE", "USED", "LIMIT", "AVAILABLE"]
    assert ["root.dev", "1/2", "memory", "1Gi", "8Gi", "7Gi"] in users
    assert ["vcore", "500m", "6", "5500m"] in users
    assert users[1][0] == "sue"
    groups = rows(ok(cli("groups", "dev", db=db)))
    assert groups[0][:2] == ["GROUP", "QUEUE"]
    assert ["vcore", "500m", "8", "7500m"] in groups
    assert json.loads(ok(cli("users", "sue", "--json", db=db)))["userName"] == "sue"  # YuniKorn's shape
    assert ok(cli("groups", "--partition", "other", db=db)).strip() == "no groups tracked"


def test_usage_without_a_queue_shows_the_tree(cli: Cli, db: str) -> None:
    ok(cli("limits", "set", "root.a", "memory=8Gi", "vcore=4", db=db))
    ok(cli("reserve", "root.a.b", "memory=2Gi", "vcore=250m", db=db))
    ok(cli("reserve", "root.c", "pods=3", db=db))
    tree = ok(cli("usage", db=db)).splitlines()
    assert tree[1].split() == ["QUEUE", "RESOURCE", "IN", "USE", "RESERVED", "LIMIT", "AVAILABLE", "USED"]
    assert any(line.startswith("  a ") for line in tree)
    assert any(line.startswith("    b ") for line in tree)  # indented under a
    memory_a = next(line.split() for line in tree if line.startswith("  a "))
    assert memory_a[:7] == ["a", "memory", "0", "2Gi", "8Gi", "6Gi", "25.0%"]
    assert ["pods", "0", "3", "-", "-"] in [line.split()[-5:] for line in tree]
    as_json = json.loads(ok(cli("usage", "--json", db=db)))
    assert as_json["root.a"]["memory"] == {
        "in_use": 0,
        "reserved": 2 * 2**30,
        "limit": 8 * 2**30,
        "available": 6 * 2**30,
    }


def test_tokens_list_has_a_header_row_and_never_the_token(cli: Cli, db: str) -> None:
    secret = ok(cli("tokens", "add", "ci", "--role", "service", "--queue", "root.ci", db=db)).strip()
    listed = ok(cli("tokens", "list", db=db))
    table = rows(listed)
    assert table[0] == ["NAME", "ROLE", "STATE", "PARTITION", "QUEUE", "CREATED"]
    assert table[1][:5] == ["ci", "service", "active", "*", "root.ci"]
    assert secret not in listed


def test_a_unique_prefix_names_a_reservation(cli: Cli, db: str) -> None:
    made = json.loads(ok(cli("reserve", "root.a", "fpga=1", "--json", db=db)))
    rid = made["id"]
    assert ok(cli("show", rid[:MIN_PREFIX], db=db)).startswith(f"{rid} pending root.a [fpga=1]")
    assert ok(cli("show", rid[:9].upper(), db=db)).startswith(rid)  # case and the hyphen do not matter
    assert f"{rid} committed" in ok(cli("commit", rid[:8], db=db))
    second = json.loads(ok(cli("reserve", "root.a", "fpga=1", "--json", db=db)))["id"]
    assert f"{second} rolled_back" in ok(cli("rollback", second[:6], db=db))
    too_short = cli("show", rid[: MIN_PREFIX - 1], db=db)
    assert too_short.returncode == 1
    assert f"give at least {MIN_PREFIX} characters" in too_short.stderr
    as_json = json.loads(cli("show", rid[:2], "--json", db=db).stderr)
    assert as_json["error"] == "ReservationIdTooShort"
    missing = cli("show", "ffff0000", db=db)
    assert missing.returncode == 1
    assert "reservation ffff0000 not found" in missing.stderr


def test_an_ambiguous_prefix_lists_the_candidates(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    chosen = ["abcd1234-0000-4000-8000-000000000001", "abcd5678-0000-4000-8000-000000000002"]
    ids = iter([uuid.UUID(i) for i in chosen])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(ids))  # two ids that share "abcd"
    with QuotaEngine.from_url(url) as engine:
        engine.migrate()
        first = engine.reserve("root.a", {"fpga": 1})
        second = engine.reserve("root.a", {"fpga": 1})
    assert [first.id, second.id] == chosen
    ambiguous = cli("commit", "abcd", db=url)
    assert ambiguous.returncode == 1
    assert ambiguous.stderr.strip() == (
        f"error: reservation id prefix 'abcd' is ambiguous: {first.id}, {second.id}"
    )
    assert json.loads(cli("show", "abcd", "--json", db=url).stderr)["error"] == "AmbiguousReservationId"
    assert ok(cli("show", "abcd5", db=url)).startswith(second.id)
    assert "pending" in ok(cli("show", first.id, db=url))  # the commit above changed nothing


def _expired_ledger(folder: Path, count: int) -> str:
    folder.mkdir(exist_ok=True)
    url = f"sqlite:///{folder / 'big.db'}"
    with QuotaEngine.from_url(url) as engine:
        engine.migrate()
        for _ in range(count):
            engine.reserve("root.a", {"fpga": 1}, ttl=0.05)
    time.sleep(0.1)
    return url


def _in_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run the CLI with stdin, stdout and stderr on a pseudo-terminal; all it wrote, and its exit code."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


SCRIPT = """
import sys
from quota_ledger.cli import main
db, config = sys.argv[1:]
for args in (["sweep", "--once", "--batch-size", "20"], ["audit"], ["config", "apply", config]):
    print("==>", args[0], flush=True)
    assert main(["--db", db, *args]) == 0
"""


def test_long_work_draws_a_bar_on_a_terminal_and_none_in_a_script(tmp_path: Path) -> None:
    url = _expired_ledger(tmp_path, 200)
    config = tmp_path / "q.yaml"
    config.write_text(CONFIG)
    command = [sys.executable, "-c", SCRIPT, url, str(config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTA_LEDGER_")}
    code, seen = _in_a_terminal(command, env | {"TERM": "xterm-256color", "COLUMNS": "100"})
    assert code == 0, seen
    sweep, audit, apply = seen.split("==> ")[1:]
    for output in (sweep, audit, apply):
        assert "━" in output  # a bar was drawn
    assert "/200" in sweep  # done of the backlog
    assert "expired 200 reservations" in sweep
    assert "audit clean" in audit
    assert "applied configuration version 1" in apply
    ledger = _expired_ledger(tmp_path / "again", 200)
    scripted = subprocess.run(
        [sys.executable, "-c", SCRIPT, ledger, str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert scripted.returncode == 0, scripted.stderr
    assert scripted.stderr == ""
    assert scripted.stdout.splitlines() == [
        "==> sweep",
        "expired 200 reservations",
        "==> audit",
        "audit clean: every counter matches the ledger history",
        "==> config",
        "applied configuration version 1",
    ]


def test_only_a_terminal_wants_a_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quota_ledger.cli import progress as cli_progress

    leader, follower = pty.openpty()
    try:
        with open(follower, "w", closefd=False) as terminal, open(tmp_path / "f", "w") as plain:
            monkeypatch.setenv("TERM", "xterm")
            assert cli_progress.wanted(terminal)
            assert not cli_progress.wanted(plain)
            monkeypatch.setenv("TERM", "dumb")
            assert not cli_progress.wanted(terminal)
    finally:
        os.close(leader)
        os.close(follower)


def test_a_token_is_never_printed_by_tokens_list_json(cli: Cli, db: str) -> None:
    with QuotaEngine.from_url(db) as engine:
        secret = tokens.add(engine, "reader-1", "reader")
    listed = ok(cli("tokens", "list", "--json", db=db))
    assert json.loads(listed)[0]["name"] == "reader-1"
    assert secret not in listed
