"""``POST /v1/reservations?dryRun=All``: the decision a reserve would get, and why, writing nothing.

The Kubernetes convention: the answer is the one the request would get (``201`` when admitted,
``409 over_quota`` when a limit stops it, the same error otherwise), and nothing is stored. The
body is the explanation (:meth:`QuotaEngine.explain`): ``admitted``, the ``violations`` (as in
a 409 ``over_quota`` body) and a ``blockers`` entry for each, naming the five largest holders of
what that limit counts. A limit outside the token's queue shows no usage and no holders, as a
refusal hides them (:mod:`quota_ledger.http.scoped`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi.responses import JSONResponse

from quota_ledger.engine import QuotaEngine
from quota_ledger.http import ledger_ops, models, scoped
from quota_ledger.http.auth import check_scope
from quota_ledger.http.errors import body as error_body
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.values import Blocker, Explanation
from quota_ledger.runtime.tokens import Token

#: the one value Kubernetes accepts for ``dryRun``
ALL = "All"


def explain(engine: QuotaEngine, body: models.ReserveBody, token: Token, key: str | None) -> JSONResponse:
    """The dry run's answer (raises what the reserve would raise, but for a limit)."""
    if body.pod is not None:
        raise InvalidRequest(
            "dryRun explains a queue and resources; a pod is tried by the admission webhook", field="pod"
        )
    if body.queue is None:
        raise InvalidRequest("queue is required (or a pod)", field="queue")
    check_scope(token, body.partition, body.queue)
    explained = engine.explain(
        body.queue,
        body.resources,
        # a token restricted to a queue may not learn of a key held outside it: no key
        **ledger_ops.reserve_arguments(body, key if token.queue is None else None),
        wait=body.wait,
        priority=body.priority,
    )
    found = as_body(explained, token)
    if explained.admitted:
        return JSONResponse(found, status_code=201)
    message = "over quota (dry run): " + "; ".join(b["where"] for b in found["blockers"])
    return JSONResponse({**error_body("over_quota", message, violations=found["violations"]), **found}, 409)


def as_body(explained: Explanation, token: Token) -> dict[str, Any]:
    """An explanation as JSON, as ``token`` may see it."""
    blockers = [_blocker(b, token) for b in explained.blockers]
    return {
        "admitted": explained.admitted,
        "dry_run": True,
        "violations": [b["violation"] for b in blockers],
        "blockers": blockers,
        # the line is the partition's: a token restricted to a queue does not see it
        "ahead": explained.ahead if token.queue is None else None,
        "ahead_needs": explained.ahead_needs if token.queue is None else {},
    }


def _blocker(blocker: Blocker, token: Token) -> dict[str, Any]:
    hidden = token.queue is not None and scoped.outside(token, blocker.violation)
    violation = blocker.violation
    return {
        "where": scoped.describe(violation, hidden),
        "violation": scoped.violation_body(violation, hidden),
        "holders": [] if hidden else [{**dataclasses.asdict(h), "held": h.held} for h in blocker.holders],
    }
