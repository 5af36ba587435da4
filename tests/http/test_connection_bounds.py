"""Connections are bounded: a request head over ``max_header_bytes`` or with more than
``max_headers`` headers is answered 431 before the application sees it (and a huge one does not
hold up other clients); a head slower than ``header_timeout`` is answered 408, an idle
connection is closed after ``keep_alive_timeout``, and past ``max_connections`` a request is
answered 503."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from http_support import in_thread

from quota_ledger.http import protocol
from quota_ledger.runtime.settings import Settings

MAX_BYTES = 8192
MAX_HEADERS = 20
HEADER_TIMEOUT = 0.5
KEEP_ALIVE = 0.5
MAX_CONNECTIONS = 3


@contextlib.contextmanager
def _serving(settings: Settings) -> Iterator[tuple[str, list[str]]]:
    """A tiny app behind the service's protocol and uvicorn options; the paths the app saw."""
    seen: list[str] = []
    app = FastAPI()

    @app.get("/ping")
    def ping(request: Request) -> dict[str, str | None]:
        seen.append("ping")
        return {"client": request.client.host if request.client else None}

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="error",
        http=protocol.bounded(settings),
        **protocol.uvicorn_options(settings),
    )
    with in_thread(config) as port:
        yield f"http://127.0.0.1:{port}", seen


@pytest.fixture
def served() -> Iterator[tuple[str, list[str]]]:
    settings = Settings(  # type: ignore[call-arg]
        db="sqlite://",
        max_header_bytes=MAX_BYTES,
        max_headers=MAX_HEADERS,
        header_timeout=HEADER_TIMEOUT,
        keep_alive_timeout=KEEP_ALIVE,
        max_connections=MAX_CONNECTIONS,
    )
    with _serving(settings) as running:
        yield running


def test_a_head_within_the_bounds_is_served(served: tuple[str, list[str]]) -> None:
    base, seen = served
    headers = {f"x-h{i}": "v" * 200 for i in range(MAX_HEADERS - 5)}
    assert httpx.get(f"{base}/ping", headers=headers).status_code == 200
    assert seen == ["ping"]


def test_a_header_over_the_byte_bound_is_refused_with_431(served: tuple[str, list[str]]) -> None:
    base, seen = served
    answer = httpx.get(f"{base}/ping", headers={"x-big": "v" * (MAX_BYTES + 1)})
    assert answer.status_code == 431
    assert answer.json()["error"]["code"] == "invalid_request"
    assert str(MAX_BYTES) in answer.json()["error"]["message"]
    assert seen == []


def test_too_many_headers_are_refused_with_431(served: tuple[str, list[str]]) -> None:
    base, seen = served
    answer = httpx.get(f"{base}/ping", headers={f"x-h{i}": "v" for i in range(MAX_HEADERS + 1)})
    assert answer.status_code == 431
    assert f"more than {MAX_HEADERS} headers" in answer.json()["error"]["message"]
    assert seen == []


def test_a_huge_header_is_cut_off_without_reading_it_whole(served: tuple[str, list[str]]) -> None:
    base, seen = served
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        refused = False
        chunk = b"v" * 65536
        try:
            while sent < 64 * 1024 * 1024:  # the server closes long before
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            refused = True
        answer = sock.recv(65536) if not refused else b""
    assert refused or answer.startswith(b"HTTP/1.1 431")
    assert sent < 4 * 1024 * 1024
    assert httpx.get(f"{base}/ping").status_code == 200  # and the service serves the others
    assert seen == ["ping"]


def _connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (or 10 s pass)."""
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def test_a_head_that_trickles_in_is_answered_408(served: tuple[str, list[str]]) -> None:
    base, seen = served
    with _connect(base) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        answer = _read_all(sock)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408")
    assert waited < 9  # closed by the server, not by the client's own timeout
    assert seen == []


def test_a_connection_that_sends_nothing_is_closed(served: tuple[str, list[str]]) -> None:
    base, _ = served
    with _connect(base) as sock:
        assert _read_all(sock) == b""  # closed, not held until the client gives up


def test_an_idle_connection_after_a_response_is_closed(served: tuple[str, list[str]]) -> None:
    base, seen = served
    with _connect(base) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        answer = _read_all(sock)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 200")
    assert waited < 4  # the setting, not uvicorn's default of 5 s
    assert seen == ["ping"]


def test_past_max_connections_a_request_is_answered_503(served: tuple[str, list[str]]) -> None:
    base, _ = served
    held = [_connect(base) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.1)  # accepted by the server
        answer = httpx.get(f"{base}/ping")
        assert answer.status_code == 503
    finally:
        for sock in held:
            sock.close()


def test_forwarded_headers_are_believed_only_from_trusted_proxies(served: tuple[str, list[str]]) -> None:
    base, _ = served
    forged = {"X-Forwarded-For": "6.6.6.6"}
    assert httpx.get(f"{base}/ping", headers=forged).json()["client"] == "127.0.0.1"
    trusting = Settings(db="sqlite://", trusted_proxies="127.0.0.1")  # type: ignore[call-arg]
    with _serving(trusting) as (behind_proxy, _):
        assert httpx.get(f"{behind_proxy}/ping", headers=forged).json()["client"] == "6.6.6.6"
