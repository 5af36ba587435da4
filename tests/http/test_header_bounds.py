"""Request heads are bounded: one over ``max_header_bytes`` or with more than ``max_headers``
headers is answered 431 before the application sees it, and a huge one does not hold up other
clients."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from quota_ledger.http import protocol
from quota_ledger.service.settings import Settings

MAX_BYTES = 8192
MAX_HEADERS = 20


@pytest.fixture
def served() -> Iterator[tuple[str, list[str]]]:
    """A tiny app behind the service's protocol with small bounds; the paths the app saw."""
    seen: list[str] = []
    app = FastAPI()

    @app.get("/ping")
    def ping() -> dict[str, bool]:
        seen.append("ping")
        return {"ok": True}

    settings = Settings(db="sqlite://", max_header_bytes=MAX_BYTES, max_headers=MAX_HEADERS)  # type: ignore[call-arg]
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", http=protocol.bounded(settings))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.should_exit = True
        thread.join(timeout=30)


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
