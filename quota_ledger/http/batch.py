"""``POST /v1/batch``: many reservation operations in one request.

Each operation is decided exactly as its own request would be (``POST /v1/reservations``,
``.../commit``, ``.../rollback``): the same role and token restrictions, the same validation,
the same errors and status codes, independently of the others. They run at the same time, one
thread each, so that an engine with batching decides them in shared transactions; their
results come back in the order sent. Operations of one batch are concurrent: a commit does not
wait for a reservation made in the same batch (send the commits in the next batch).
"""

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal

import pydantic
import pydantic_core
from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from quota_ledger.http import errors, ledger_ops, models
from quota_ledger.http.auth import Authenticator
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.service.tokens import Token

log = logging.getLogger("quota_ledger.http")

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


def build(auth: Authenticator, ops: ledger_ops.LedgerOps, executor: ThreadPoolExecutor) -> APIRouter:
    """The ``/v1/batch`` route; operations run on ``executor`` (one thread each)."""
    router = APIRouter(prefix="/v1", responses={code: spec for code, spec in _ERRORS.items()})
    service = Depends(auth.require("service"))

    @router.post("/batch", response_model=BatchOut, tags=["ledger"])
    async def batch(body: BatchBody, token: Annotated[Token, service]) -> Response:
        """Reserve, commit and roll back many reservations in one request; each operation is
        decided as its own request would be, and the results come in the order sent."""
        loop = asyncio.get_running_loop()
        work = [_operation(ops, token, item) for item in body.operations]
        outcomes = await asyncio.gather(*(loop.run_in_executor(executor, _outcome, w) for w in work))
        results = [{"status": status, "body": found} for status, found in outcomes]
        content = json.dumps({"results": results}, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        return Response(content.encode(), media_type="application/json")

    return router


def _operation(ops: ledger_ops.LedgerOps, token: Token, item: dict[str, Any]) -> Callable[[], Outcome]:
    """The operation ``item`` asks for, as a call returning (status, body)."""
    kind = item.get("op")
    if kind == "reserve":
        fields = {k: v for k, v in item.items() if k != "op"}

        def reserve() -> Outcome:
            body = models.ReserveBody.model_validate(fields)
            return 201, ledger_ops.reservation_body(ops.reserve(body, token, body.key))

        return reserve
    if kind == "commit":

        def commit() -> Outcome:
            op = CommitOp.model_validate(item)
            return 200, ledger_ops.reservation_body(ops.commit(op.id, token, op.resources))

        return commit
    if kind == "rollback":

        def rollback() -> Outcome:
            op = RollbackOp.model_validate(item)
            return 200, ledger_ops.reservation_body(ops.rollback(op.id, token))

        return rollback
    refused = (422, errors.body("invalid_request", f"op must be one of {', '.join(OPERATIONS)}", field="op"))
    return lambda: refused


def _outcome(work: Callable[[], Outcome]) -> Outcome:
    """(status, body) of one operation: its result, or the error its own request would get."""
    try:
        return work()
    except QuotaLedgerError as error:
        return errors.ledger_error(error)
    except HTTPException as error:
        return error.status_code, errors.http_error(error)
    except pydantic.ValidationError as error:
        problems = error.errors(include_url=False, include_context=False, include_input=False)
        return 422, pydantic_core.to_jsonable_python(errors.validation_error(problems))
    except Exception:
        log.exception("unexpected error in a batch operation")
        return 500, errors.body("internal", "internal error")


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": models.ErrorOut, "description": text}
    for code, text in (
        (401, "no or unknown token"),
        (403, "the token's role is below service"),
        (413, "body over 1 MiB"),
        (422, f"the body is malformed, or carries more than {MAX_OPERATIONS} operations"),
    )
}
