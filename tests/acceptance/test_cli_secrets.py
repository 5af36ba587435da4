"""The ``quota-ledger`` command never prints a secret it was given: a database URL's password,
however malformed the URL, nor a service token; and the token can come from a file
(``--token-file``, ``QUOTA_LEDGER_TOKEN_FILE``), since ``--token`` shows it in ``ps``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

EXIT_ERROR, EXIT_USAGE = 1, 2
SECRET = "zq7s3cretpw"
TOKEN = "qlt_zq7t0kenvalue"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("QUOTA_LEDGER_")}
    return subprocess.run(
        [sys.executable, "-m", "quota_ledger.cli", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=120,
        check=False,
    )


def shown(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


#: malformed database URLs, each hiding SECRET (or pieces of it) where a password goes
MALFORMED = [
    f"postgresql://u:{SECRET}@host:notaport/x",
    f"postgresql://u:pa {SECRET}@127.0.0.1:1/x",  # a space in the password
    f"postgresql://u:{SECRET}@[::1/x",
    f"postgresql://u:p@{SECRET}@127.0.0.1:1/x",  # an @ in the password
    f"postgresql://u:{SECRET}/x",  # no host: the password stands where a port goes
    f"u:{SECRET}@host/x",  # no scheme
    f"mysql+nodriver://u:{SECRET}@h/x",
    f"oracle://u:{SECRET}@h/x",
    f"postgresql://u:{SECRET}@h1:1/x postgresql://u:{SECRET}@h2:notaport/x",
]


@pytest.mark.parametrize("url", MALFORMED)
@pytest.mark.parametrize("how", ["--db", "env", "settings file", "--json -v"])
def test_a_malformed_database_url_is_refused_without_its_password(url: str, how: str, tmp_path: Path) -> None:
    if how == "env":
        result = cli("usage", env={"QUOTA_LEDGER_DB": url})
    elif how == "settings file":
        settings = tmp_path / "settings.env"
        settings.write_text(f"QUOTA_LEDGER_DB={url}\n")
        result = cli("--settings", str(settings), "usage")
    elif how == "--json -v":
        result = cli("--db", url, "--json", "-v", "usage")
        assert json.loads(result.stderr)["error"] == "InvalidRequest"
    else:
        result = cli("--db", url, "usage")
    assert result.returncode == EXIT_ERROR, result.stderr
    assert SECRET not in shown(result)
    assert "Traceback" not in shown(result)
    assert result.stderr.startswith("{" if how == "--json -v" else "error: ")


def test_a_database_that_refuses_the_connection_is_named_without_the_password() -> None:
    result = cli("--db", f"postgresql://ann:{SECRET}@127.0.0.1:1/ledger", "-v", "usage")
    assert result.returncode == EXIT_ERROR
    assert "cannot connect to ann@127.0.0.1:1/ledger" in result.stderr
    assert SECRET not in shown(result)


def test_an_unexpected_error_is_one_line_without_a_traceback() -> None:
    result = cli(
        "usage", env={"QUOTA_LEDGER_DB": f"postgresql://u:{SECRET}@h/x", "QUOTA_LEDGER_POOL_SIZE": "x"}
    )
    assert result.returncode == EXIT_ERROR
    assert result.stderr.startswith("error: ValidationError: ")
    assert "Traceback" not in result.stderr
    assert SECRET not in shown(result)


# -- the service token ------------------------------------------------------------------------
class FakeService(ThreadingHTTPServer):
    """Answers like the service: 401 without TOKEN, an empty queue tree with it."""

    seen: list[str | None]


class _Handler(BaseHTTPRequestHandler):
    server: FakeService

    def do_GET(self) -> None:
        given = self.headers.get("Authorization")
        self.server.seen.append(given)
        if given == f"Bearer {TOKEN}":
            status, body = 200, {}
        else:
            status = 401
            body = {"error": {"code": "unauthorized", "message": "a bearer token is required"}}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def service() -> Iterator[FakeService]:
    server = FakeService(("127.0.0.1", 0), _Handler)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url_of(service: FakeService) -> str:
    return f"http://127.0.0.1:{service.server_address[1]}"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n\n")
    path.chmod(0o600)
    return path


def test_the_token_is_read_from_the_file_of_token_file(service: FakeService, token_file: Path) -> None:
    result = cli("--url", url_of(service), "--token-file", str(token_file), "usage")
    assert result.returncode == 0, result.stderr
    assert service.seen == [f"Bearer {TOKEN}"]
    assert result.stderr == ""  # the file is the owner's only: no warning


def test_the_token_file_may_be_named_by_the_environment(service: FakeService, token_file: Path) -> None:
    env = {"QUOTA_LEDGER_URL": url_of(service), "QUOTA_LEDGER_TOKEN_FILE": str(token_file)}
    assert cli("usage", env=env).returncode == 0
    assert service.seen == [f"Bearer {TOKEN}"]


def test_the_command_line_wins_over_the_environment(service: FakeService, token_file: Path) -> None:
    env = {"QUOTA_LEDGER_TOKEN": "qlt_wrong"}
    assert cli("--url", url_of(service), "--token-file", str(token_file), "usage", env=env).returncode == 0
    assert service.seen == [f"Bearer {TOKEN}"]


def test_a_refused_token_names_the_file_it_came_from(service: FakeService, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text(f"{TOKEN}x\n")
    result = cli("--url", url_of(service), "--token-file", str(wrong), "usage")
    assert result.returncode == EXIT_ERROR
    assert f"check the token given by --token-file {wrong}" in result.stderr
    assert TOKEN not in shown(result)


def test_without_a_token_the_message_names_every_way_to_give_one(service: FakeService) -> None:
    result = cli("--url", url_of(service), "usage")
    assert result.returncode == EXIT_ERROR
    for way in ("--token-file", "--token ", "QUOTA_LEDGER_TOKEN"):
        assert way in result.stderr


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "No such file or directory"),
        ("", "the file is empty"),
        ("  \n\n", "the file is empty"),
        (f"{TOKEN}\nsecond-line-{TOKEN}\n", "whitespace or characters a token cannot have"),
        (f"TOKEN={TOKEN} # the ci token\n", "whitespace or characters a token cannot have"),
        ("directory", "Is a directory"),
        ("x" * 5000, "more than 4096 bytes"),
        ("tok\u00e9n", "characters a token cannot have"),
    ],
    ids=["missing", "empty", "blank", "two lines", "not just a token", "directory", "huge", "not ascii"],
)
@pytest.mark.parametrize("how", ["--token-file", "env", "--json"])
def test_a_token_file_without_a_token_is_refused_before_any_request(
    service: FakeService, tmp_path: Path, content: str | None, reason: str, how: str
) -> None:
    path = tmp_path / "token"
    if content == "directory":
        path.mkdir()
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    if how == "env":
        result = cli("--url", url_of(service), "usage", env={"QUOTA_LEDGER_TOKEN_FILE": str(path)})
        source = f"QUOTA_LEDGER_TOKEN_FILE={path}"
    else:
        result = cli(
            "--url", url_of(service), "--token-file", str(path), *(["--json"] * (how == "--json")), "usage"
        )
        source = f"--token-file {path}"
    assert result.returncode == EXIT_USAGE
    assert service.seen == []
    if how == "--json":
        error = json.loads(result.stderr)
        assert error["error"] == "TokenUnavailable"
        assert error["message"].startswith(f"no bearer token from {source}: ")
        assert reason in error["message"]
    else:
        assert result.stderr.startswith(f"error: no bearer token from {source}: ")
        assert reason in result.stderr
    assert TOKEN not in shown(result)
    assert "Traceback" not in shown(result)


def test_a_token_given_two_ways_at_once_is_refused(service: FakeService, token_file: Path) -> None:
    both = cli("--url", url_of(service), "--token", TOKEN, "--token-file", str(token_file), "usage")
    assert both.returncode == EXIT_USAGE
    assert "--token and --token-file" in both.stderr
    env = {"QUOTA_LEDGER_TOKEN": TOKEN, "QUOTA_LEDGER_TOKEN_FILE": str(token_file)}
    both_env = cli("--url", url_of(service), "usage", env=env)
    assert both_env.returncode == EXIT_USAGE
    assert "QUOTA_LEDGER_TOKEN and QUOTA_LEDGER_TOKEN_FILE" in both_env.stderr
    assert service.seen == []
    assert TOKEN not in shown(both) + shown(both_env)


def test_a_token_file_others_can_read_is_used_with_a_warning(service: FakeService, token_file: Path) -> None:
    token_file.chmod(0o644)
    result = cli("--url", url_of(service), "--token-file", str(token_file), "usage")
    assert result.returncode == 0
    assert f"warning: the token file {token_file} can be read by other users" in result.stderr
    assert TOKEN not in shown(result)


def test_a_token_file_is_not_read_without_url(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert cli("--db", db, "db", "upgrade").returncode == 0
    assert cli("--db", db, "--token-file", str(tmp_path / "missing"), "usage").returncode == 0
