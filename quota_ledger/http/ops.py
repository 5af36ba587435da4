"""Operations: health, readiness, Prometheus metrics, the audit and pruning idle counters."""

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from fastapi.responses import JSONResponse

from quota_ledger.driver import migrate
from quota_ledger.engine import QuotaEngine
from quota_ledger.http import models
from quota_ledger.http.auth import Authenticator, check_scope
from quota_ledger.http.metrics import CONTENT_TYPE, Metrics
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.runtime import sweeper
from quota_ledger.runtime.tokens import Token


def build(
    engine: QuotaEngine,
    auth: Authenticator,
    metrics: Metrics,
    *,
    sweep: sweeper.Health | None,
    unready_after: float,
) -> APIRouter:
    """The operations routes; ``sweep``: the health of this process's expiry loop, which makes
    the service unready once it has failed for more than ``unready_after`` seconds."""
    router = APIRouter(tags=["operations"])
    guarded: dict[int | str, dict[str, Any]] = {
        code: {"model": models.ErrorOut, "description": text}
        for code, text in (
            (401, "no or unknown token"),
            (403, "wrong role or partition"),
            (422, "invalid request"),
            (503, "database unavailable"),
        )
    }
    reader = Depends(auth.require("reader"))

    @router.get("/healthz")
    def healthz() -> dict[str, str]:
        """The process is up (no database access, no token)."""
        return {"status": "ok"}

    @router.get("/readyz", responses={503: {"model": models.ErrorOut}})
    def readyz() -> JSONResponse:
        """The database answers, its schema is at head, and the expiry sweep (if this process
        runs one) has not been failing for longer than allowed (no token)."""
        try:
            current = migrate.current(engine.driver.engine)
            head = migrate.head()
        except QuotaLedgerError as error:
            return JSONResponse({"status": "unavailable", "reason": str(error)}, 503, {"Retry-After": "1"})
        except Exception:
            return JSONResponse(
                {"status": "unavailable", "reason": "database unreachable"}, 503, {"Retry-After": "1"}
            )
        if current != head:
            return JSONResponse(
                {"status": "unavailable", "reason": f"schema at {current}, head is {head}"},
                503,
                {"Retry-After": "5"},
            )
        if sweep is not None and (failing := sweep.failing_for()) > unready_after:
            # The error itself is in the log: this answer needs no token.
            reason = f"the expiry sweep has been failing for {failing:.0f} s"
            return JSONResponse({"status": "unavailable", "reason": reason}, 503, {"Retry-After": "5"})
        return JSONResponse({"status": "ready", "schema": current})

    @router.get("/metrics", response_class=Response, responses=guarded)
    def prometheus(token: Annotated[Token, reader]) -> Response:
        """Prometheus text format; only for tokens restricted to no partition or queue (the
        metrics cover every partition)."""
        if token.partition is not None or token.queue is not None:
            raise HTTPException(403, "the metrics cover every partition: they need an unrestricted token")
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @router.post("/v1/audit", response_model=list[models.DriftOut], responses=guarded)
    def audit(
        token: Annotated[Token, reader],
        fix: Annotated[bool, Query()] = False,
        partition: Annotated[str | None, Query(max_length=64)] = None,
    ) -> list[models.DriftOut]:
        """Counters that disagree with the ledger's history; ``fix=true`` (admin) repairs them."""
        if fix and not token.allows("admin"):
            raise HTTPException(403, "fixing needs the admin role")
        check_scope(token, partition, None)
        drifts = engine.audit(fix=fix, partition=partition)
        metrics.drift_found.inc(len(drifts))
        if fix:
            metrics.drift_fixed.inc(len(drifts))
        return [models.DriftOut.model_validate(dataclasses.asdict(d)) for d in drifts]

    @router.post("/v1/prune", response_model=models.PruneOut, responses=guarded)
    def prune(
        token: Annotated[Token, reader],
        apply: Annotated[bool, Query()] = False,
        partition: Annotated[str | None, Query(max_length=64)] = None,
    ) -> models.PruneOut:
        """Counters at zero that nothing references; ``apply=true`` (admin) deletes them, all or
        nothing."""
        if apply and not token.allows("admin"):
            raise HTTPException(403, "pruning needs the admin role")
        check_scope(token, partition, None)
        found = engine.prune(apply=apply, partition=partition)
        counters = [models.IdleCounterOut.model_validate(dataclasses.asdict(c)) for c in found]
        return models.PruneOut(applied=apply, counters=counters)

    return router
