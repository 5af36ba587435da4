"""The service's logs: an access log line a request, and the application lines at INFO.

Each request is logged once it is answered, on the ``quota_ledger.access`` logger: method,
path, status, duration and the name of the token that made it (never the token itself, and
never the query string, which may hold ``?token=``). ``text`` (the default) writes
``2026-11-24T00:10:01.123Z 127.0.0.1 GET /v1/limits 200 3.1ms token=ops``; ``json`` writes
the same facts as one JSON object a line; ``off`` writes nothing. The other ``quota_ledger``
loggers (the application summary ``QUOTA_APP_SUMMARY: {...}``, the sweeper) log at INFO.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any, Literal

access = logging.getLogger("quota_ledger.access")

AccessLogFormat = Literal["text", "json", "off"]
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class AccessLog:
    """ASGI middleware: one line a request, after the response (or the failure) is sent."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], fmt: AccessLogFormat) -> None:
        self.app = app
        self.json = fmt == "json"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # unless a response starts: the server answers 500 to an app that fails

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            took = (time.perf_counter() - started) * 1000
            access.info(self.line(scope, status, took))

    def line(self, scope: Scope, status: int, took_ms: float) -> str:
        # The auth dependency leaves the token it accepted in the request's state.
        token = (scope.get("state") or {}).get("token")
        name = getattr(token, "name", None)
        client = (scope.get("client") or ("-",))[0]
        when = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        if self.json:
            fields = {
                "time": when,
                "client": client,
                "method": scope["method"],
                "path": scope["path"],
                "status": status,
                "duration_ms": round(took_ms, 1),
                "token": name,
            }
            return json.dumps(fields, separators=(",", ":"))
        method, path = printable(scope["method"]), printable(scope["path"])
        return f"{when} {client} {method} {path} {status} {took_ms:.1f}ms token={name or '-'}"


def printable(text: str) -> str:
    """``text`` with control characters, spaces and backslashes escaped: a path sent with an
    encoded newline or terminal escape cannot forge a line or repaint a terminal, and every
    line still splits into its fields on spaces."""
    return text.translate(_ESCAPES)


_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x21), *range(0x7F, 0xA0))} | {ord("\\"): "\\\\"}


def configure(fmt: AccessLogFormat, *, verbose: bool = False) -> None:
    """Send the service's logs to standard error: the ``quota_ledger`` loggers at INFO (DEBUG
    with ``verbose``), the access log as bare lines (they carry their own time)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("quota_ledger")
    root.handlers = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False
    plain = logging.StreamHandler(sys.stderr)
    plain.setFormatter(logging.Formatter("%(message)s"))
    access.handlers = [plain]
    access.propagate = False
    access.setLevel(logging.WARNING if fmt == "off" else logging.INFO)
