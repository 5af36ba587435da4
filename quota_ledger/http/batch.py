"""``POST /v1/batch``: many reservation operations in one request.

Each operation is decided exactly as its own request would be (``POST /v1/reservations``,
``.../commit``, ``.../rollback``): the same role and token restrictions, the same validation,
the same errors and status codes, independently of the others. One thread checks them all,
then hands them to the engine at once: with batching, group commit decides them in shared
transactions (each in its own savepoint; see :meth:`GroupCommit.run_many`), without it they
are decided one after another. Their results come back in the order sent. Operations of one
batch are concurrent: a commit does not wait for a reservation made in the same batch (send
the commits in the next batch).
"""

import json
from typing import Annotated, Any, Literal

import pydantic
import pydantic_core
from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from quota_ledger.http import errors, ledger_ops, models
from quota_ledger.http.auth import Authenticator
from quota_ledger.model.errors import InvalidRequest, QuotaLedgerError
from quota_ledger.runtime.tokens import Token

#: operations one ``POST /v1/batch`` may carry (422 beyond)
MAX_OPERATIONS = 1000
OPERATIONS = ("reserve", "commit", "rollback")

Outcome = tuple[int, Any]


class CommitOp(BaseModel):
    model_config = ConfigDict(extra="forbid")

    op: Literal["commit"]
    id: str
    resources: dict[str, models.Quantity] | None = None


class RollbackOp(BaseModel):
    model_config = ConfigDict(extra="forbid")

    op: Literal["rollback"]
    id: str


class BatchBody(BaseModel):
    """Operations, each ``{"op": "reserve", ...}`` (the body of ``POST /v1/reservations``),
    ``{"op": "commit", "id": ..., "resources": ...}`` or ``{"op": "rollback", "id": ...}``."""

    model_config = ConfigDict(extra="forbid")

    operations: list[dict[str, Any]] = Field(
        ...,
        max_length=MAX_OPERATIONS,
        examples=[
            [
                {"op": "reserve", "queue": "root.project-a", "resources": {"fpga": 1}},
                {"op": "commit", "id": "6f1c0e9e-8d0b-4a5e-9a57-0c2d4b1f7e21"},
                {"op": "rollback", "id": "0b5e7c4d-2f1a-4c3b-8e6d-9a8b7c6d5e4f"},
            ]
        ],
    )


class ResultOut(BaseModel):
    """One operation's outcome: the status and body its own request would have answered."""

    status: int
    body: dict[str, Any]


class BatchOut(BaseModel):
    results: list[ResultOut]


def build(auth: Authenticator, ops: ledger_ops.LedgerOps) -> APIRouter:
    """The ``/v1/batch`` route; each batch runs on one worker thread."""
    router = APIRouter(prefix="/v1", responses={code: spec for code, spec in _ERRORS.items()})
    service = Depends(auth.require("service"))

    @router.post("/batch", response_model=BatchOut, tags=["ledger"])
    async def batch(body: BatchBody, token: Annotated[Token, service]) -> Response:
        """Reserve, commit and roll back many reservations in one request; each operation is
        decided as its own request would be, and the results come in the order sent."""
        outcomes = await run_in_threadpool(_decide, ops, token, body.operations)
        results = [{"status": status, "body": found} for status, found in outcomes]
        content = json.dumps({"results": results}, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        return Response(content.encode(), media_type="application/json")

    return router


def _decide(ops: ledger_ops.LedgerOps, token: Token, items: list[dict[str, Any]]) -> list[Outcome]:
    """(status, body) of every operation: each checked in turn, then all decided at once."""
    outcomes: list[Outcome | None] = []
    planned: list[tuple[int, int, ledger_ops.Planned]] = []  # (where, status on success, operation)
    for item in items:
        try:
            status, plan = _plan(ops, token, item)
        except Exception as error:  # this operation's refusal
            outcomes.append(_refusal(error))
        else:
            planned.append((len(outcomes), status, plan))
            outcomes.append(None)
    decided = ops.decide_all([plan for _, _, plan in planned])
    for (where, status, _), outcome in zip(planned, decided, strict=True):
        if isinstance(outcome, Exception):
            outcomes[where] = _refusal(outcome)
        else:
            outcomes[where] = status, ledger_ops.reservation_body(outcome)
    return [outcome for outcome in outcomes if outcome is not None]


def _plan(ops: ledger_ops.LedgerOps, token: Token, item: dict[str, Any]) -> tuple[int, ledger_ops.Planned]:
    """The operation ``item`` asks for, checked, with the status of its success."""
    kind = item.get("op")
    if kind == "reserve":
        body = models.ReserveBody.model_validate({k: v for k, v in item.items() if k != "op"})
        return 201, ops.plan_reserve(body, token, body.key)
    if kind == "commit":
        commit = CommitOp.model_validate(item)
        return 200, ops.plan_commit(commit.id, token, commit.resources)
    if kind == "rollback":
        rollback = RollbackOp.model_validate(item)
        return 200, ops.plan_rollback(rollback.id, token)
    raise InvalidRequest(f"op must be one of {', '.join(OPERATIONS)}", field="op")


def _refusal(error: Exception) -> Outcome:
    """(status, body) of an operation's error: what its own request would get."""
    if isinstance(error, QuotaLedgerError):
        return errors.ledger_error(error)
    if isinstance(error, HTTPException):
        return error.status_code, errors.http_error(error)
    if isinstance(error, pydantic.ValidationError):
        problems = error.errors(include_url=False, include_context=False, include_input=False)
        return 422, pydantic_core.to_jsonable_python(errors.validation_error(problems))
    return 500, errors.internal(error)


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": models.ErrorOut, "description": text}
    for code, text in (
        (401, "no or unknown token"),
        (403, "the token's role is below service"),
        (413, "body over 1 MiB"),
        (422, f"the body is malformed, or carries more than {MAX_OPERATIONS} operations"),
    )
}
