"""Ledger errors as JSON: a stable code, the message, and the details a caller needs.

Nothing else leaves the service: no stack traces, no SQL.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import Counter
from starlette.exceptions import HTTPException as StarletteHTTPException

from quota_ledger.http import scoped
from quota_ledger.model import errors
from quota_ledger.openstack import keystone

log = logging.getLogger("quota_ledger.http")

#: answers of 500 ``internal`` in this process; every app's metrics registry serves it
INTERNAL_ERRORS = Counter(
    "quota_ledger_internal_errors",
    "Requests and batch operations answered 500 internal: errors the service does not map",
    registry=None,
)

#: error class -> (HTTP status, code); the first match in this order wins
_TABLE: tuple[tuple[type[Exception], int, str], ...] = (
    (errors.OverQuota, 409, "over_quota"),
    (errors.MissingCoveringQuota, 409, "missing_covering_quota"),
    (errors.IdempotencyConflict, 409, "idempotency_conflict"),
    (errors.ReservationStateError, 409, "invalid_state"),
    (errors.UsageUnderflow, 409, "usage_underflow"),
    (errors.CounterOverflow, 409, "counter_overflow"),
    (errors.RemovesAllLimits, 409, "removes_all_limits"),
    (errors.ManagedQueue, 409, "managed_queue"),
    (errors.NotFound, 404, "not_found"),
    (errors.ReservationNotFound, 404, "not_found"),
    (errors.ConfigError, 422, "invalid_config"),
    (errors.InvalidResourceQuota, 422, "invalid_resource_quota"),
    (errors.InvalidQuantity, 422, "invalid_quantity"),
    (errors.PodMissingResources, 422, "pod_missing_resources"),
    (errors.TooManyResources, 422, "too_many_resources"),
    (errors.UnknownResource, 422, "unknown_resource"),
    (errors.UnknownQueue, 422, "unknown_queue"),
    (errors.InvalidRequest, 422, "invalid_request"),
    (errors.DatabaseUnavailable, 503, "database_unavailable"),
    (keystone.KeystoneUnreachable, 503, "keystone_unavailable"),
    (keystone.KeystoneError, 502, "keystone_error"),
    (errors.SchemaNotReady, 503, "schema_not_ready"),
)
RETRY_AFTER_SECONDS = "1"


class SafeJSONResponse(JSONResponse):
    """JSON in ASCII: a message may quote what the caller sent, lone surrogates included, and
    those cannot be encoded as UTF-8."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def body(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **({"details": details} if details else {})}}


def _details(error: errors.QuotaLedgerError) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if isinstance(error, errors.OverQuota):
        found["violations"] = scoped.violations_body(error)
    if isinstance(error, errors.ConfigError):
        found["problems"] = [dataclasses.asdict(p) for p in error.problems]
    if isinstance(error, errors.InvalidResourceQuota):
        found["errors"] = [{"field": f, "message": m} for f, m in error.errors]
    if isinstance(error, errors.InvalidRequest) and error.field is not None:
        found["field"] = error.field
    if isinstance(error, errors.MissingCoveringQuota):
        found.update(resources=error.resources, scopes=error.scopes)
    if isinstance(error, errors.PodMissingResources):
        found.update(quota=error.quota, missing=error.missing)
    if isinstance(error, errors.UsageUnderflow):
        found["shortfalls"] = {r: {"in_use": a, "requested": b} for r, (a, b) in error.shortfalls.items()}
    if isinstance(error, errors.ReservationStateError):
        found["state"] = error.state.value
    if isinstance(error, errors.RemovesAllLimits):
        found["partitions"] = error.partitions
    if isinstance(error, errors.ManagedQueue):
        found.update(queue=error.queue, owned=error.owned, manager=error.manager)
    if isinstance(error, errors.UnknownResource):
        found.update(partition=error.partition, resources=error.resources, suggestions=error.suggestions)
    if isinstance(error, errors.UnknownQueue):
        found.update(partition=error.partition, queue=error.queue, suggestion=error.suggestion)
    return found


def status_of(error: errors.QuotaLedgerError) -> tuple[int, str]:
    """(HTTP status, error code) of a ledger error."""
    for cls, http_status, name in _TABLE:
        if isinstance(error, cls):
            return http_status, name
    return 500, "internal"


def ledger_error(error: errors.QuotaLedgerError) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of a ledger error; one the table does not map is :func:`internal`."""
    status, code = status_of(error)
    if status == 500:
        return status, internal(error)
    if isinstance(error, errors.DatabaseUnreachable):
        # The host and the driver's words are for the operator's log, not for callers.
        log.warning("answered 503: %s", error)
        return status, body(code, errors.DatabaseUnavailable.__doc__ or "", **_details(error))
    return status, body(code, str(error), **_details(error))


def internal(error: BaseException) -> dict[str, Any]:
    """The body of a 500 for ``error``, which the service does not map: the caller learns
    nothing of it; the log gets it with its cause (a database error's own words, say), and
    :data:`INTERNAL_ERRORS` counts it."""
    INTERNAL_ERRORS.inc()
    log.error("answered 500 internal: %s: %s", type(error).__name__, error, exc_info=error)
    return body("internal", "internal error")


def ledger_response(error: errors.QuotaLedgerError) -> JSONResponse:
    status, content = ledger_error(error)
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if status == 503 else None
    return SafeJSONResponse(content, status_code=status, headers=headers)


def validation_error(problems: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The 422 body of a malformed request: every problem, the first one's field named.

    ``problems`` are pydantic's (or FastAPI's) errors; their ``body`` location step is left out.
    """
    found = [
        {"field": ".".join(str(p) for p in e.get("loc", ()) if p != "body"), "message": e.get("msg", "")}
        for e in problems
    ]
    field = found[0]["field"] if found else None
    return body("invalid_request", "the request is malformed", field=field, problems=found)


def unreadable_body(
    problems: Sequence[Mapping[str, Any]], raw: bytes, content_type: str | None
) -> dict[str, Any] | None:
    """The 422 body of a request whose body is not JSON at all, saying what to do about it: the
    line and column of a JSON syntax error, or the header a form-encoded body (curl's ``-d``
    default) lacks. None when the body is JSON and only its fields are wrong."""
    for problem in problems:
        if problem.get("type") != "json_invalid":
            continue
        loc = problem.get("loc", ())
        offset = loc[-1] if loc and isinstance(loc[-1], int) else 0
        text = raw.decode("utf-8", "replace")
        line = text.count("\n", 0, offset) + 1
        column = offset - (text.rfind("\n", 0, offset) + 1) + 1
        reason = str((problem.get("ctx") or {}).get("error") or problem.get("msg") or "JSON decode error")
        message = f"the body is not valid JSON: {reason} at line {line}, column {column}"
        return body("invalid_request", message, field="body", line=line, column=column)
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if raw and not (media == "application/json" or media.endswith("+json")):
        shown = media or "no Content-Type"
        message = f"the body must be a JSON object, not {shown}: send Content-Type: application/json"
        return body("invalid_request", message, field="body")
    return None


_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
}


def http_error(error: StarletteHTTPException) -> dict[str, Any]:
    """The JSON body of an HTTP error raised by a route (401, 403, 422...)."""
    return body(_HTTP_CODES.get(error.status_code, "http_error"), str(error.detail))


def install(app: FastAPI) -> None:
    @app.exception_handler(errors.QuotaLedgerError)
    async def _ledger(_request: Request, error: errors.QuotaLedgerError) -> JSONResponse:
        return ledger_response(error)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        unreadable = unreadable_body(problems, await request.body(), request.headers.get("content-type"))
        return SafeJSONResponse(unreadable or validation_error(problems), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, error: StarletteHTTPException) -> JSONResponse:
        return SafeJSONResponse(
            http_error(error),
            status_code=error.status_code,
            headers=getattr(error, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, error: Exception) -> JSONResponse:
        return SafeJSONResponse(internal(error), status_code=500)
