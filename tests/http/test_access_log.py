"""The service's logs: a line a request (text or JSON lines), naming the token but never
showing it, and the application summary at INFO."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from http_support import Service, sign_in

from quota_ledger import QuotaEngine
from quota_ledger.http.app import create_app
from quota_ledger.runtime import tokens
from quota_ledger.runtime.settings import Settings

TEXT_LINE = (
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z 127\.0\.0\.1 GET /v1/limits 200 \d+\.\dms token=test-reader$"
)


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "quota_ledger.access"]


def test_every_request_is_one_text_line_with_the_token_name(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="quota_ledger.access")
    secret = service.tokens["reader"]
    with service.client("reader") as reader:
        assert reader.get("/v1/limits").status_code == 200
    with service.client(None) as anonymous:
        assert anonymous.get("/v1/limits").status_code == 401
        assert sign_in(anonymous, secret).status_code == 303  # the token is in the form's body
        assert anonymous.get("/ui", params={"token": secret}).status_code == 200
    lines = _access_lines(caplog)
    assert len(lines) == 5
    assert re.match(TEXT_LINE, lines[0]), lines[0]
    assert lines[1].split()[2:5] == ["GET", "/v1/limits", "401"]
    assert lines[1].endswith("token=-")
    assert lines[2].split()[2:5] == ["GET", "/ui/login", "200"]
    assert lines[3].split()[2:5] == ["POST", "/ui/login", "303"]
    assert lines[3].endswith("token=test-reader")
    assert lines[4].split()[3] == "/ui"  # the path only: the query string may hold a token
    assert lines[4].endswith("token=test-reader")
    assert all(secret not in line for line in lines)


def test_json_lines_and_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="quota_ledger.access")
    body = {"queue": "root.a", "resources": {"fpga": 1}}
    with QuotaEngine.from_url(f"sqlite:///{tmp_path / 'l.db'}") as engine:
        engine.migrate()
        secret = tokens.add(engine, "ops", "admin")
        for fmt in ("json", "off"):
            settings = Settings(db="sqlite://", access_log=fmt)  # type: ignore[call-arg]
            app = create_app(engine, settings, sweep=False)

            async def reserve(app: FastAPI = app) -> int:
                transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 5000))
                async with httpx.AsyncClient(transport=transport, base_url="http://ledger") as client:
                    made = await client.post(
                        "/v1/reservations", json=body, headers={"Authorization": f"Bearer {secret}"}
                    )
                    return made.status_code

            assert asyncio.run(reserve()) == 201
    [line] = _access_lines(caplog)
    entry = json.loads(line)
    assert entry["client"] == "10.0.0.7"
    assert entry["method"] == "POST"
    assert entry["path"] == "/v1/reservations"
    assert entry["status"] == 201
    assert entry["token"] == "ops"
    assert isinstance(entry["duration_ms"], float)
    assert entry["time"].endswith("Z")
    assert secret not in line


def test_serve_logs_requests_as_json_and_the_application_summary_at_info(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'l.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTA_LEDGER_")}
    env |= {"QUOTA_LEDGER_DB": db, "QUOTA_LEDGER_ACCESS_LOG": "text"}
    run = [sys.executable, "-m", "quota_ledger.cli"]
    subprocess.run([*run, "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)
    secret = subprocess.run(
        [*run, "tokens", "add", "svc", "--role", "service"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    # the switch wins over the setting
    server = subprocess.Popen(
        [*run, "serve", "--port", "0", "--no-sweep", "--access-log", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        base = server.stdout.readline().split()[3]
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}) as client:
            made = client.post(
                "/v1/reservations",
                json={"queue": "root.a", "resources": {"fpga": 1}, "application": "app-1", "user": "sue"},
            ).json()
            assert client.post(f"/v1/reservations/{made['id']}/commit").status_code == 200
            released = client.post(f"/v1/reservations/{made['id']}/release", json={"finished": True})
            assert released.status_code == 200
        time.sleep(0.5)
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    requests = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [(r["method"], r["status"], r["token"]) for r in requests] == [
        ("POST", 201, "svc"),
        ("POST", 200, "svc"),
        ("POST", 200, "svc"),
    ]
    summary = [line for line in err.splitlines() if "QUOTA_APP_SUMMARY: " in line]
    assert len(summary) == 1
    assert " INFO quota_ledger.summary: " in summary[0]
    assert json.loads(summary[0].split("QUOTA_APP_SUMMARY: ", 1)[1])["appId"] == "app-1"
    assert secret not in err


def test_a_path_cannot_forge_a_line_or_send_terminal_escapes() -> None:
    from quota_ledger.http.access_log import printable

    forged = "/v1/x\n2026-01-01T00:00:00Z 6.6.6.6 POST /v1/audit 200 1.0ms token=admin\x1b[2J\\x0a"
    line = printable(forged)
    assert "\n" not in line
    assert "\x1b" not in line
    assert " " not in line
    assert line.startswith("/v1/x\\x0a2026")
    assert line.endswith("\\\\x0a")  # a backslash sent is told apart from an escape
