"""``POST /v1/admission/pods``: the validating admission webhook for pods.

The API server sends an ``admission.k8s.io/v1`` AdmissionReview of each pod CREATE and waits
for ``allowed``. An admitted pod holds a pending reservation, keyed by its ``metadata.uid``,
until it is seen stored (or it expires after ``admission_ttl``). A refusal is an answer
(``allowed: false`` with a 403 status), never an HTTP error. A review that cannot be read is
answered 400; an unavailable database 503 and anything unexpected 500, so that the webhook's
``failurePolicy`` decides: never ``allowed: true`` by mistake.

Callers: a token of the ``admission`` role (or ``admin``), or a client certificate verified
against ``tls_client_ca`` (the API server's), which counts as the admission role.
"""

# No ``from __future__ import annotations``: FastAPI reads the handler's annotations, which name
# a dependency local to build().
import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from quota_ledger.engine import QuotaEngine
from quota_ledger.http import errors, models
from quota_ledger.http.auth import Authenticator
from quota_ledger.http.metrics import Metrics
from quota_ledger.kube import admission_review as reviews
from quota_ledger.model.errors import (
    IdempotencyConflict,
    InvalidRequest,
    MissingCoveringQuota,
    OverQuota,
    PodMissingResources,
    UnknownQueue,
    UnknownResource,
)
from quota_ledger.model.values import ReservationState
from quota_ledger.runtime.settings import Settings
from quota_ledger.runtime.tokens import Token

#: seconds the API server waits for a webhook that sets no ``timeoutSeconds``
DEFAULT_TIMEOUT = 10.0
#: of the API server's timeout, the share the database may take: the rest carries the answer
DATABASE_SHARE = 0.8
#: the role a verified client certificate has
ROLE = "admission"


def caller(auth: Authenticator) -> Any:
    """The dependency that lets the admission role in: a verified client certificate, else a
    bearer token that :meth:`Token.allows` the role, restricted to no partition or queue."""
    by_token = auth.require(ROLE)

    async def dependency(request: Request) -> Token:
        tls = request.scope.get("extensions", {}).get("tls", {})
        subject = tls.get("client_cert_name") if isinstance(tls, dict) else None
        if isinstance(subject, str) and subject:
            token = Token(f"client-certificate:{subject}", ROLE)
            request.state.token = token  # for the access log
            return token
        token = await by_token(request)
        if token.partition is not None or token.queue is not None:
            # A pod may go to any namespace's queue, and a refusal names the limits it broke:
            # a token restricted to a partition or a subtree would act and see outside it.
            raise HTTPException(
                403, "the admission webhook admits pods to any queue: it needs an unrestricted token"
            )
        return token

    return dependency


def outcome(review: reviews.Review, answer: dict[str, Any]) -> str:
    """What became of ``review``, answered ``answer``: one of the metrics' admission outcomes."""
    if not review.pod_create:
        return "not_pod_create"
    if review.dry_run:
        return "dry_run"
    return "allowed" if answer["response"]["allowed"] else "refused"


def build(engine: QuotaEngine, auth: Authenticator, settings: Settings, metrics: Metrics) -> APIRouter:
    router = APIRouter(prefix="/v1")
    allowed = Depends(caller(auth))
    trusted = settings.trusted_users

    def decide(review: reviews.Review, seconds: float) -> dict[str, Any]:
        if not review.pod_create:
            return reviews.allowed(review)  # not ours to judge; nothing is written
        pod = reviews.pod_of(review)
        try:
            user, groups = reviews.payer(review, pod, trusted)
            reservation = engine.admit_pod(
                pod,
                user=user,
                groups=groups,
                ttl=settings.admission_ttl,
                dry_run=review.dry_run,
                timeout=seconds * DATABASE_SHARE,
            )
        except OverQuota as error:
            return reviews.refused(review, reviews.exceeded(error.violations))
        except MissingCoveringQuota as error:
            return reviews.refused(review, reviews.uncovered(error.resources, error.scopes))
        except (PodMissingResources, IdempotencyConflict, UnknownResource, UnknownQueue) as error:
            return reviews.refused(review, str(error))
        except InvalidRequest as error:  # the pod, not the review: the API server sent it as is
            return reviews.refused(review, str(error), code=400, reason="BadRequest")
        notes = reviews.reservation_annotations(reservation.id, reservation.state.value, review.dry_run)
        if reservation.state in (ReservationState.PENDING, ReservationState.COMMITTED):
            return reviews.allowed(review, notes)
        # The same pod uid again, after its reservation ended: nothing is held for it any more.
        message = f"the reservation {reservation.id} made for this pod is {reservation.state.value}"
        return reviews.refused(review, message, annotations=notes)

    @router.post(
        "/admission/pods",
        tags=["kubernetes"],
        responses={
            200: {"description": "the AdmissionReview with its response: allowed, or refused with a status"},
            **{
                code: {"model": models.ErrorOut, "description": text}
                for code, text in (
                    (400, "not an admission.k8s.io/v1 AdmissionReview, or a bad timeout"),
                    (401, "no certificate, and no or an unknown token"),
                    (403, "a token of another role than admission or admin"),
                    (500, "an internal error: the webhook's failurePolicy decides"),
                    (503, "database unavailable, or busy past the timeout (Retry-After)"),
                )
            },
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"type": "object", "title": "AdmissionReview"}}},
            }
        },
    )
    async def admit_pods(
        request: Request,
        _token: Annotated[Token, allowed],
        timeout: Annotated[str | None, Query(max_length=40)] = None,
    ) -> JSONResponse:
        """The validating admission webhook: an ``admission.k8s.io/v1`` AdmissionReview in,
        the same with its ``response`` out. A pod CREATE reserves what the pod needs (pending,
        keyed by its ``metadata.uid``); ``dryRun`` decides without writing; every other review
        is allowed and changes nothing. ``timeout`` (the API server's, e.g. ``10s``) bounds
        the database time."""
        started = time.perf_counter()
        became = "error"  # unless an answer comes: a 400, a 500 or a 503
        try:
            try:
                seconds = DEFAULT_TIMEOUT if timeout is None else reviews.duration(timeout)
                review = reviews.parse(json.loads(await request.body()))
            except (ValueError, InvalidRequest) as error:
                message = str(error) if isinstance(error, InvalidRequest) else "the body is not JSON"
                raise HTTPException(400, message) from error
            answer = await run_in_threadpool(decide, review, seconds)
            became = outcome(review, answer)
            return errors.SafeJSONResponse(answer)
        finally:
            metrics.review(became, started)

    return router
