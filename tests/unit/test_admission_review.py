"""Reading AdmissionReviews and wording the webhook's answers: no database."""

from __future__ import annotations

from typing import Any

import pytest

from quota_ledger.kube import admission_review as reviews
from quota_ledger.model.values import Violation


def body(**request: Any) -> dict[str, Any]:
    given = {
        "uid": "r-1",
        "operation": "CREATE",
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team",
        "userInfo": {"username": "alice", "groups": ["dev"]},
        "object": {"metadata": {"name": "web", "uid": "p-1"}, "spec": {"containers": [{"name": "a"}]}},
    }
    given.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": given}


@pytest.mark.parametrize(
    ("text", "seconds"), [("10s", 10.0), ("1m30s", 90.0), ("500ms", 0.5), ("1.5s", 1.5), ("1h0m0s", 3600.0)]
)
def test_a_go_duration_is_read_as_seconds(text: str, seconds: float) -> None:
    assert reviews.duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "soon", "10s ", "s", "-1s", "10x"])
def test_anything_else_is_not_a_timeout(text: str) -> None:
    with pytest.raises(reviews.InvalidReview):
        reviews.duration(text)


def test_a_pod_create_is_read_with_its_requester() -> None:
    review = reviews.parse(body(dryRun=True))
    assert (review.uid, review.pod_create, review.dry_run) == ("r-1", True, True)
    assert (review.username, review.groups) == ("alice", ("dev",))
    assert reviews.pod_of(review)["metadata"]["namespace"] == "team"


@pytest.mark.parametrize(
    "request_given",
    [
        {"operation": "DELETE", "object": None},
        {"subResource": "ephemeralcontainers"},
        {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
    ],
)
def test_other_reviews_are_not_pod_creates(request_given: dict[str, Any]) -> None:
    review = reviews.parse(body(**request_given))
    assert review.pod_create is False
    assert reviews.allowed(review) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "r-1", "allowed": True},
    }


@pytest.mark.parametrize(
    "broken",
    [
        [],
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
        body(uid=""),
        body(operation=None),
        body(userInfo={"username": "alice", "groups": "dev"}),
        body(dryRun="yes"),
        body(object=None),
    ],
)
def test_a_malformed_review_is_refused(broken: Any) -> None:
    with pytest.raises(reviews.InvalidReview):
        reviews.parse(broken)


def test_the_annotation_names_the_payer_only_for_a_trusted_requester() -> None:
    info = {"yunikorn.apache.org/user.info": '{"user": "bob", "groups": ["ml"]}'}
    pod = {
        "metadata": {"namespace": "team", "uid": "p-1", "annotations": info},
        "spec": {"containers": [{"name": "a"}]},
    }
    plain = reviews.parse(body())
    assert reviews.payer(plain, reviews.pod_of(plain), frozenset()) == ("alice", ("dev",))
    annotated = reviews.parse(body(object=pod))
    assert reviews.payer(annotated, pod, {"alice"}) == ("bob", ("ml",))
    with pytest.raises(reviews.UntrustedUserInfo, match=r"^user alice with groups \[dev\] is not allowed"):
        reviews.payer(annotated, pod, {"someone-else"})


def test_an_exceeded_quota_lists_every_resource_over_it_sorted() -> None:
    over = [
        Violation(scope="team/compute", resource="requests.memory", limit=2**30, in_use=2**29, reserved=0,
                  requested=2**30, kind="quota"),
        Violation(scope="team/compute", resource="requests.cpu", limit=1000, in_use=600, reserved=200,
                  requested=500, kind="quota"),
        Violation(scope="root.team", resource="vcore", limit=4000, in_use=0, reserved=3900, requested=500),
    ]  # fmt: skip
    assert reviews.exceeded(over) == (
        "exceeded quota: compute, requested: requests.cpu=500m,requests.memory=1Gi, "
        "used: requests.cpu=800m,requests.memory=512Mi, limited: requests.cpu=1,requests.memory=1Gi"
    )
    assert reviews.exceeded(over[2:]).startswith("exceeded quota: queue root.team, requested: vcore=")


def test_an_uncovered_resource_comes_before_scopes() -> None:
    assert reviews.uncovered(["pods"], ["{PriorityClass Exists []}"]) == "insufficient quota to consume: pods"
    assert reviews.uncovered([], ["{PriorityClass In [a b]}"]) == (
        "insufficient quota to match these scopes: [{PriorityClass In [a b]}]"
    )
