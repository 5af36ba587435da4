"""``admission.k8s.io/v1`` AdmissionReview: what a validating webhook reads and answers.

The API server sends a review of one operation on one object and waits for ``allowed`` (with a
``status`` when refused). This module reads the review, decides who pays for a pod (its
requester, or the user its ``yunikorn.apache.org/user.info`` annotation names when a trusted
requester set it, as YuniKorn's admission controller allows), and words the answers: the
refusals of the ResourceQuota admission plugin (``exceeded quota: ...``) for quota limits. It
never patches: this webhook validates only.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quota_ledger.kube import pods
from quota_ledger.kube import quotas as kube_quotas
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.quantity import format_human
from quota_ledger.model.values import Violation

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
#: the audit annotation naming the reservation an admitted pod holds
RESERVATION_ANNOTATION = "reservation"


class InvalidReview(InvalidRequest):
    """The body is not an ``admission.k8s.io/v1`` AdmissionReview with a request."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Review:
    """The parts of an AdmissionReview's ``request`` the ledger decides on."""

    #: echoed in the response: the API server matches answers to calls by it
    uid: str
    api_version: str
    operation: str
    #: ``pods`` of the core group, no subresource: the only reviews that reserve
    pod_create: bool
    namespace: str | None
    username: str
    groups: tuple[str, ...]
    dry_run: bool
    #: ``request.object`` (the pod) of a CREATE, None otherwise
    object: Mapping[str, Any] | None


def parse(body: object) -> Review:
    """The review in ``body``, or :class:`InvalidReview` naming what is wrong."""
    if not isinstance(body, Mapping):
        raise InvalidReview("an AdmissionReview must be a JSON object", field="body")
    api_version = body.get("apiVersion")
    if api_version != API_VERSION or body.get("kind") != KIND:
        raise InvalidReview(
            f"expected apiVersion {API_VERSION} and kind {KIND}, not "
            f"{api_version!r} and {body.get('kind')!r}",
            field="apiVersion",
        )
    request = body.get("request")
    if not isinstance(request, Mapping):
        raise InvalidReview("the review has no request", field="request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise InvalidReview("request.uid must be a non-empty string", field="request.uid")
    operation = request.get("operation")
    if not isinstance(operation, str) or not operation:
        raise InvalidReview("request.operation must be a string", field="request.operation")
    resource = request.get("resource")
    if not isinstance(resource, Mapping):
        raise InvalidReview("request.resource must be a mapping", field="request.resource")
    user_info = request.get("userInfo") or {}
    if not isinstance(user_info, Mapping):
        raise InvalidReview("request.userInfo must be a mapping", field="request.userInfo")
    username = user_info.get("username") or ""
    groups = user_info.get("groups") or []
    if (
        not isinstance(username, str)
        or not isinstance(groups, list)
        or not all(isinstance(g, str) for g in groups)
    ):
        raise InvalidReview("request.userInfo has a username and a list of groups", field="request.userInfo")
    dry_run = request.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise InvalidReview("request.dryRun must be true or false", field="request.dryRun")
    namespace = request.get("namespace")
    pod_create = (
        operation == "CREATE"
        and resource.get("group", "") == ""
        and resource.get("resource") == "pods"
        and not request.get("subResource")
    )
    found = request.get("object")
    if pod_create and not isinstance(found, Mapping):
        raise InvalidReview("a pod CREATE review carries the pod in request.object", field="request.object")
    return Review(
        uid=uid,
        api_version=api_version,
        operation=operation,
        pod_create=pod_create,
        namespace=namespace if isinstance(namespace, str) and namespace else None,
        username=username,
        groups=tuple(groups),
        dry_run=dry_run,
        object=found if pod_create and isinstance(found, Mapping) else None,
    )


def pod_of(review: Review) -> dict[str, Any]:
    """The reviewed pod, in the review's namespace when its own metadata names none."""
    pod = copy.deepcopy(dict(review.object or {}))
    meta = pod.get("metadata")
    if isinstance(meta, dict) and not meta.get("namespace") and review.namespace is not None:
        meta["namespace"] = review.namespace
    return pod


class UntrustedUserInfo(InvalidRequest):
    """The requester may not name who pays with the user.info annotation."""

    def __init__(self, username: str, groups: Sequence[str]) -> None:
        self.username = username
        self.groups = list(groups)
        # YuniKorn's admission controller refuses with these words.
        super().__init__(
            f"user {username} with groups [{','.join(groups)}] is not allowed to set user annotation",
            field=pods.USER_INFO,
        )


def payer(review: Review, pod: Mapping[str, Any], trusted: Collection[str]) -> tuple[str, tuple[str, ...]]:
    """Who pays for the pod: the requester, or the annotation's user when ``trusted`` lists the
    requester (controllers that create pods for their users: YuniKorn's rule). An untrusted
    requester that sets the annotation raises :class:`UntrustedUserInfo`."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    raw = annotations.get(pods.USER_INFO) if isinstance(annotations, Mapping) else None
    if raw is None:
        return review.username, review.groups
    if review.username not in trusted:
        raise UntrustedUserInfo(review.username, review.groups)
    request = pods.parse_pod(pod)  # raises InvalidRequest for a malformed annotation
    if request.user is None:  # not reached: parse_pod read the annotation found above
        raise InvalidRequest(f"{pods.USER_INFO} names no user", field=pods.USER_INFO)
    return request.user, request.groups


def exceeded(violations: Sequence[Violation]) -> str:
    """The refusal for the first limit broken, in the ResourceQuota admission plugin's words:
    ``exceeded quota: compute, requested: requests.cpu=2, used: requests.cpu=9, limited:
    requests.cpu=10``, every resource of that limit that is over, sorted. Queue, user and group
    limits read the same with the queue (and who) in place of the quota's name."""
    first = violations[0]
    same = sorted(
        (v for v in violations if (v.kind, v.scope, v.name) == (first.kind, first.scope, first.name)),
        key=lambda v: v.resource,
    )

    def listed(amount: Any) -> str:
        return ",".join(f"{v.resource}={_quantity(v, amount(v))}" for v in same)

    return (
        f"exceeded quota: {_limit_name(first)}, requested: {listed(lambda v: v.requested)}, "
        f"used: {listed(lambda v: v.in_use + v.reserved)}, limited: {listed(lambda v: v.limit)}"
    )


def uncovered(resources: Sequence[str], scopes: Sequence[str]) -> str:
    """The refusal for a limited resource or scope no quota covers, in the ResourceQuota
    admission plugin's words (resources first, as it checks them first)."""
    if resources:
        return f"insufficient quota to consume: {','.join(resources)}"
    return f"insufficient quota to match these scopes: [{' '.join(scopes)}]"


#: seconds of each unit of a Go duration (``time.Duration.String``), as ``?timeout=`` carries it
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6, "ns": 1e-9}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(h|ms|m|s|us|\u00b5s|ns)")


def duration(text: str) -> float:
    """Seconds of a Go duration such as ``10s``, ``1m30s`` or ``500ms`` (the API server's
    ``?timeout=``); :class:`InvalidReview` for anything else."""
    position, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if not text or position != len(text):
        raise InvalidReview(
            f"timeout must be a duration such as 10s or 1m30s, not {text[:40]!r}", field="timeout"
        )
    return total


def _limit_name(violation: Violation) -> str:
    if violation.kind == "quota":
        return violation.scope.rsplit("/", 1)[-1]  # namespace/name: Kubernetes prints the name
    if violation.kind in ("user", "group") and violation.name is not None:
        return f"queue {violation.scope} for {violation.kind} {violation.name}"
    return f"queue {violation.scope}"


def _quantity(violation: Violation, units: int) -> str:
    if violation.kind == "quota":
        return kube_quotas.format_value(violation.resource, units)
    return format_human(violation.resource, units)


def allowed(review: Review, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The answer admitting the object."""
    return _answer(review, {"allowed": True}, annotations)


def refused(
    review: Review,
    message: str,
    *,
    code: int = 403,
    reason: str = "Forbidden",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The answer refusing the object; ``message`` is what ``kubectl`` prints after the
    webhook's name."""
    status = {"code": code, "reason": reason, "message": message, "status": "Failure"}
    return _answer(review, {"allowed": False, "status": status}, annotations)


def _answer(
    review: Review, response: dict[str, Any], annotations: Mapping[str, str] | None
) -> dict[str, Any]:
    response = {"uid": review.uid, **response}
    if annotations:
        response["auditAnnotations"] = dict(annotations)
    return {"apiVersion": review.api_version, "kind": KIND, "response": response}


def reservation_annotations(reservation_id: str, state: str, dry_run: bool) -> dict[str, str]:
    """``auditAnnotations`` naming the reservation (audit events carry them under the webhook's
    name): its id and state, and ``dry-run`` when nothing was written."""
    found = {RESERVATION_ANNOTATION: reservation_id, f"{RESERVATION_ANNOTATION}-state": state}
    return {**found, "dry-run": "true"} if dry_run else found
