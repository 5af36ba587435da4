"""The hot routes' plain requests, answered without FastAPI's routing and dependency resolution.

``POST /v1/reservations`` with a JSON body and no ``Idempotency-Key`` header, and ``POST
/v1/reservations/{id}/commit`` or ``/rollback`` without a body or a query string, from a bearer token already
verified (in the token cache) whose role allows them. Profiled, FastAPI's route matching and
dependency resolution took about half of such a request's Python. This lane runs the same
:class:`~quota_ledger.http.ledger_ops.LedgerOps` call on the same thread pool and answers with
the same bytes, status and error bodies; every other request, and any request it cannot take
as it stands (no cached token, a body that does not validate, ...), goes on to the application
with its body intact, so that FastAPI answers it as before.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import pydantic
from fastapi import HTTPException
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from quota_ledger.http import errors, ledger_ops, models
from quota_ledger.http.auth import Authenticator
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.model.values import Reservation

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_PREFIX = "/v1/reservations"


class FastLane:
    """ASGI middleware in front of the application (inside the body limit and access log)."""

    def __init__(self, app: App, auth: Authenticator, ops: ledger_ops.LedgerOps) -> None:
        self.app = app
        self.auth = auth
        self.ops = ops

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("query_string"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        action = _action(path)
        if action is None:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        token = self._token(headers)
        if token is None or b"idempotency-key" in headers:
            await self.app(scope, receive, send)
            return
        body, cut = await _read(receive)
        call = self._call(action, path, headers, body, token) if cut is None else None
        if call is None:
            await self.app(scope, _replay(body, cut, receive), send)
            return
        scope.setdefault("state", {})["token"] = token  # for the access log
        response = await _answer(call, 201 if action == "reserve" else 200)
        await response(scope, receive, send)

    def _token(self, headers: dict[bytes, bytes]) -> Any:
        scheme, _, value = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            return None
        hit, token = self.auth.cached(value.strip())
        return token if hit and token is not None and token.allows("service") else None

    def _call(
        self, action: str, path: str, headers: dict[bytes, bytes], body: bytes, token: Any
    ) -> Callable[[], Reservation] | None:
        """The LedgerOps call of the request, or None to leave it to the application."""
        if action == "reserve":
            kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if kind != b"application/json":
                return None
            try:
                parsed = models.ReserveBody.model_validate(json.loads(body))
            except (ValueError, RecursionError, pydantic.ValidationError):
                return None
            if parsed.wait is not None:
                return None  # it may wait in line: the application answers 201 or 202
            return lambda: self.ops.reserve(parsed, token, parsed.key)
        if body:
            return None
        rid = path.split("/")[3]
        if action == "commit":
            return lambda: self.ops.commit(rid, token, None)
        return lambda: self.ops.rollback(rid, token)


async def _answer(call: Callable[[], Reservation], status: int) -> Response:
    """The call's reservation, or the error body the application's handlers would give."""
    try:
        return ledger_ops.reservation_response(await run_in_threadpool(call), status)
    except QuotaLedgerError as error:
        return errors.ledger_response(error)
    except HTTPException as error:
        return errors.SafeJSONResponse(
            errors.http_error(error), status_code=error.status_code, headers=error.headers
        )
    except Exception as error:
        return errors.SafeJSONResponse(errors.internal(error), status_code=500)


def _action(path: str) -> str | None:
    """``reserve``, ``commit`` or ``rollback`` for the lane's paths, else None."""
    if path == _PREFIX:
        return "reserve"
    if not path.startswith(_PREFIX + "/"):
        return None
    rid, _, action = path[len(_PREFIX) + 1 :].partition("/")
    if rid and action in ("commit", "rollback"):
        return action
    return None


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in scope.get("headers") or []}


async def _read(receive: Receive) -> tuple[bytes, Message | None]:
    """The body, and the message that cut it short, if one did (a disconnect)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes, cut: Message | None, receive: Receive) -> Receive:
    """A receive that gives the body already read (and what cut it short), then what comes next."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": cut is not None}]
    if cut is not None:
        pending.append(cut)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
