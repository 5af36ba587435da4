"""The admission webhook over real HTTPS on loopback, as the API server calls it.

Reviews carry pods built with the ``kubernetes`` client's models and serialized as the client
serializes them; the service presents a certificate of a test CA (``trustme``), which also
issues the API server's client certificate.
"""

from __future__ import annotations

import re
import ssl
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
import uvicorn
from http_support import in_thread
from kubernetes import client as k8s
from sqlalchemy import func, select
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine, ReservationNotFound
from quota_ledger.driver.schema import metadata
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.http import protocol
from quota_ledger.http.app import create_app
from quota_ledger.runtime import tokens
from quota_ledger.runtime.settings import Settings

NAMESPACE = "team"
CONTROLLER = "system:serviceaccount:yunikorn:yunikorn-admission-controller"


@dataclass
class Webhook:
    base: str
    engine: QuotaEngine
    tokens: dict[str, str]
    ca: trustme.CA

    def client(self, role: str | None = "admission", *, certificate: bool = False) -> httpx.Client:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if certificate:
            self.ca.issue_cert("kube-apiserver").configure_cert(context)
        headers = {} if role is None else {"Authorization": f"Bearer {self.tokens[role]}"}
        return httpx.Client(base_url=self.base, headers=headers, verify=context, timeout=30)

    def admit(self, body: dict[str, Any], **params: str) -> dict[str, Any]:
        with self.client() as http:
            answer = http.post("/v1/admission/pods", json=body, params=params)
        assert answer.status_code == 200, answer.text
        response: dict[str, Any] = answer.json()["response"]
        return response

    def reservation(self, pod_uid: str) -> Any:
        return self.engine.get_by_key(pod_uid)


def _serve(url: URL, tmp_path: Path, **settings_given: Any) -> Iterator[Webhook]:
    ca = trustme.CA()
    served = tmp_path / "server.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(served))
    client_ca = tmp_path / "client-ca.pem"
    ca.cert_pem.write_to_path(str(client_ca))
    engine = QuotaEngine.from_url(url, pool_size=20)
    engine.migrate()
    issued = {role: tokens.add(engine, f"test-{role}", role) for role in tokens.ROLES}
    settings = Settings(
        db="sqlite://",
        token_cache_seconds=0.0,
        sweep_interval=0.2,
        tls_client_ca=str(client_ca),
        admission_trusted_users=CONTROLLER,
        **settings_given,
    )
    config = uvicorn.Config(
        create_app(engine, settings),
        host="127.0.0.1",
        port=0,
        http=protocol.bounded(settings),
        **protocol.uvicorn_options(settings),
        ssl_certfile=str(served),
        ssl_keyfile=str(served),
        log_level="warning",
        lifespan="on",
    )
    try:
        with in_thread(config) as port:
            yield Webhook(f"https://127.0.0.1:{port}", engine, issued, ca)
    finally:
        engine.close()


@pytest.fixture
def webhook(postgres_url: URL, tmp_path: Path) -> Iterator[Webhook]:
    """The service over HTTPS on PostgreSQL, pods ``admission_ttl`` 1 s."""
    yield from _serve(postgres_url, tmp_path, admission_ttl=1.0)


@pytest.fixture
def any_webhook(db_url: URL, tmp_path: Path) -> Iterator[Webhook]:
    """The service over HTTPS on each backend."""
    yield from _serve(db_url, tmp_path)


@pytest.fixture
def server_webhook(server_db_url: URL, tmp_path: Path) -> Iterator[Webhook]:
    """The service over HTTPS on PostgreSQL and MariaDB (row locks, concurrency)."""
    yield from _serve(server_db_url, tmp_path)


def pod(
    uid: str | None = None,
    *,
    name: str | None = "web",
    generate_name: str | None = None,
    cpu: str = "500m",
    priority_class: str | None = None,
    annotations: dict[str, str] | None = None,
) -> k8s.V1Pod:
    requests = {"cpu": cpu, "memory": "256Mi"}
    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(
            name=name,
            generate_name=generate_name,
            namespace=NAMESPACE,
            uid=uid if uid is not None else str(uuid.uuid4()),
            annotations=annotations,
        ),
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(
                    name="app",
                    image="registry.example/app:1",
                    resources=k8s.V1ResourceRequirements(requests=requests, limits=requests),
                )
            ],
            priority_class_name=priority_class,
        ),
    )


def uid_of(manifest: k8s.V1Pod) -> str:
    assert manifest.metadata is not None
    assert manifest.metadata.uid is not None
    return manifest.metadata.uid


def review(
    manifest: k8s.V1Pod,
    *,
    uid: str | None = None,
    operation: str = "CREATE",
    dry_run: bool = False,
    user: str = "alice",
    groups: tuple[str, ...] = ("dev", "system:authenticated"),
) -> dict[str, Any]:
    """An AdmissionReview of ``manifest`` as the API server sends it (a new request uid each)."""
    serialized = k8s.ApiClient().sanitize_for_serialization(manifest)  # type: ignore[no-untyped-call]
    request: dict[str, Any] = {
        "uid": uid if uid is not None else str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": serialized["metadata"].get("name"),
        "namespace": NAMESPACE,
        "operation": operation,
        "userInfo": {"username": user, "uid": "u-1", "groups": list(groups)},
        "object": None if operation == "DELETE" else serialized,
        "oldObject": serialized if operation == "DELETE" else None,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def row_counts(engine: QuotaEngine) -> dict[str, int]:
    def work(tx: LedgerTx) -> dict[str, int]:
        return {
            t.name: tx.conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in metadata.sorted_tables
        }

    return engine.driver.run(work)


def test_the_same_pod_under_two_review_uids_holds_one_reservation(webhook: Webhook) -> None:
    manifest = pod()
    first = webhook.admit(review(manifest))
    second = webhook.admit(review(manifest))
    assert first["allowed"]
    assert second["allowed"]
    held = webhook.reservation(uid_of(manifest))
    assert (held.state, held.user, held.groups) == ("pending", "alice", ("dev", "system:authenticated"))
    assert first["auditAnnotations"]["reservation"] == second["auditAnnotations"]["reservation"] == held.id
    assert webhook.engine.usage(f"root.{NAMESPACE}")["vcore"].reserved == 500


def test_a_generate_name_retry_is_a_second_reservation_and_the_first_expires(webhook: Webhook) -> None:
    first = pod(name=None, generate_name="web-")
    retry = pod(name=None, generate_name="web-")  # the API server's retry: a new name, a new uid
    assert webhook.admit(review(first))["allowed"]
    assert webhook.admit(review(retry))["allowed"]
    assert webhook.reservation(uid_of(first)).id != webhook.reservation(uid_of(retry)).id
    webhook.engine.commit(webhook.reservation(uid_of(retry)).id)  # the one stored is seen
    deadline = time.monotonic() + 15
    while webhook.reservation(uid_of(first)).state != "expired":
        assert time.monotonic() < deadline, "the reservation of a pod never stored did not expire"
        time.sleep(0.2)
    usage = webhook.engine.usage(f"root.{NAMESPACE}")["vcore"]
    assert (usage.in_use, usage.reserved) == (500, 0)


def test_dry_run_decides_and_writes_no_rows(any_webhook: Webhook) -> None:
    any_webhook.engine.set_limits(f"root.{NAMESPACE}", {"pods": 1})
    before = row_counts(any_webhook.engine)
    manifest = pod()
    answer = any_webhook.admit(review(manifest, dry_run=True))
    assert answer["allowed"] is True
    assert answer["auditAnnotations"]["dry-run"] == "true"
    too_big = any_webhook.admit(review(pod(cpu="2"), dry_run=True))
    assert too_big["allowed"] is True  # pods: 1, and nothing was held by the first dry run
    assert row_counts(any_webhook.engine) == before
    with pytest.raises(ReservationNotFound):
        any_webhook.reservation(uid_of(manifest))


def test_the_answer_echoes_the_review_uid_and_never_patches(webhook: Webhook) -> None:
    body = review(pod(), uid="705ab4f5-6393-11e8-b7cc-42010a800002")
    with webhook.client() as http:
        answer = http.post("/v1/admission/pods", json=body, params={"timeout": "10s"}).json()
    assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert answer["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert answer["response"]["allowed"] is True
    assert not {"patch", "patchType"} & set(answer["response"])


def test_a_held_partition_lock_answers_503_within_the_timeout(server_webhook: Webhook) -> None:
    assert server_webhook.admit(review(pod()))["allowed"]  # the partition and its counters exist
    engine = server_webhook.engine
    with engine.driver.engine.connect() as conn, conn.begin():
        LedgerTx(conn, engine.driver.backend, 0).lock_partition("default", exclusive=True)
        started = time.monotonic()
        with server_webhook.client() as http:
            answer = http.post("/v1/admission/pods", json=review(pod()), params={"timeout": "2s"})
        took = time.monotonic() - started
    assert answer.status_code == 503, answer.text
    assert took < 2.0


def test_64_concurrent_reviews_at_a_limit_admit_exactly_the_limit(server_webhook: Webhook) -> None:
    server_webhook.engine.set_limits(f"root.{NAMESPACE}", {"pods": 5})
    bodies = [review(pod(name=f"web-{n}")) for n in range(64)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(server_webhook.admit, bodies))
    assert sum(a["allowed"] for a in answers) == 5
    assert all(a["status"]["code"] == 403 for a in answers if not a["allowed"])
    assert server_webhook.engine.usage(f"root.{NAMESPACE}")["pods"].reserved == 5


def test_a_delete_review_is_allowed_and_changes_nothing(webhook: Webhook) -> None:
    manifest = pod()
    assert webhook.admit(review(manifest))["allowed"]
    before = row_counts(webhook.engine)
    answer = webhook.admit(review(manifest, operation="DELETE"))
    assert answer == {"uid": answer["uid"], "allowed": True}
    assert row_counts(webhook.engine) == before


def test_a_scoped_priority_class_without_a_covering_quota_is_refused_in_upstream_words(
    webhook: Webhook,
) -> None:
    webhook.engine.apply_admission_config(
        {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "ResourceQuotaConfiguration",
            "limitedResources": [
                {
                    "resource": "pods",
                    "matchScopes": [
                        {"scopeName": "PriorityClass", "operator": "In", "values": ["cluster-services"]}
                    ],
                }
            ],
        }
    )
    answer = webhook.admit(review(pod(priority_class="cluster-services")))
    assert answer["allowed"] is False
    assert answer["status"] == {
        "code": 403,
        "reason": "Forbidden",
        "status": "Failure",
        "message": "insufficient quota to match these scopes: [{PriorityClass In [cluster-services]}]",
    }


def test_an_exceeded_quota_is_refused_in_upstream_words(webhook: Webhook) -> None:
    webhook.engine.apply_resource_quota(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "compute", "namespace": NAMESPACE},
            "spec": {"hard": {"requests.cpu": "1", "requests.memory": "1Gi"}},
        }
    )
    assert webhook.admit(review(pod(cpu="600m")))["allowed"]
    answer = webhook.admit(review(pod(cpu="600m")))
    assert answer["allowed"] is False
    assert answer["status"]["message"] == (
        "exceeded quota: compute, requested: requests.cpu=600m, used: requests.cpu=600m, "
        "limited: requests.cpu=1"
    )


def test_the_user_info_annotation_counts_from_a_trusted_controller_only(webhook: Webhook) -> None:
    annotated = {"yunikorn.apache.org/user.info": '{"user": "bob", "groups": ["ml"]}'}
    from_controller = pod(annotations=annotated)
    assert webhook.admit(review(from_controller, user=CONTROLLER))["allowed"]
    held = webhook.reservation(uid_of(from_controller))
    assert (held.user, held.groups) == ("bob", ("ml",))
    refused = webhook.admit(review(pod(annotations=annotated), user="mallory", groups=("dev",)))
    assert refused["allowed"] is False
    assert (
        refused["status"]["message"] == "user mallory with groups [dev] is not allowed to set user annotation"
    )


def test_a_pod_without_a_uid_is_refused_as_a_bad_request(webhook: Webhook) -> None:
    body = review(pod())
    del body["request"]["object"]["metadata"]["uid"]
    answer = webhook.admit(body)
    assert (answer["allowed"], answer["status"]["code"]) == (False, 400)
    assert "metadata.uid" in answer["status"]["message"]


def test_a_malformed_review_answers_400(webhook: Webhook) -> None:
    with webhook.client() as http:
        assert http.post("/v1/admission/pods", content=b"{not json").status_code == 400
        assert http.post("/v1/admission/pods", json={"kind": "AdmissionReview"}).status_code == 400
        assert (
            http.post("/v1/admission/pods", json=review(pod()), params={"timeout": "soon"}).status_code == 400
        )


def test_the_admission_role_calls_admission_only(webhook: Webhook) -> None:
    body = review(pod())
    with webhook.client("admission") as http:
        assert http.get("/v1/reservations", params={"key": "x"}).status_code == 403
        assert http.get("/v1/queues").status_code == 403
        assert (
            http.post("/v1/reservations", json={"queue": "root.a", "resources": {"vcore": 1}}).status_code
            == 403
        )
    for role in ("reader", "service"):
        with webhook.client(role) as http:
            assert http.post("/v1/admission/pods", json=body).status_code == 403
    with webhook.client("admin") as http:
        assert http.post("/v1/admission/pods", json=body).json()["response"]["allowed"] is True
    with webhook.client(None) as http:
        assert http.post("/v1/admission/pods", json=review(pod())).status_code == 401


def test_a_verified_client_certificate_is_the_admission_role(webhook: Webhook) -> None:
    with webhook.client(None, certificate=True) as http:
        answer = http.post("/v1/admission/pods", json=review(pod()))
        assert answer.status_code == 200
        assert answer.json()["response"]["allowed"] is True
        assert http.get("/v1/queues").status_code == 401  # the certificate is for the webhook only


def test_an_internal_error_answers_500_never_allowed(
    webhook: Webhook, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(webhook.engine, "admit_pod", broken)
    with webhook.client() as http:
        answer = http.post("/v1/admission/pods", json=review(pod()))
    assert answer.status_code == 500
    assert "response" not in answer.json()


def admission_metrics(webhook: Webhook) -> dict[str, tuple[float, float]]:
    """Each outcome's (reviews counted, latencies observed) in the service's /metrics."""
    with webhook.client("admin") as http:
        text = http.get("/metrics").text

    def value(name: str, outcome: str) -> float:
        found = re.search(rf'^{name}{{outcome="{outcome}"}} (\S+)$', text, re.MULTILINE)
        assert found is not None, (name, outcome)
        return float(found.group(1))

    return {
        outcome: (
            value("quota_ledger_admission_reviews_total", outcome),
            value("quota_ledger_admission_seconds_count", outcome),
        )
        for outcome in ("allowed", "refused", "dry_run", "not_pod_create", "error")
    }


def test_reviews_are_counted_by_outcome_with_their_latency(webhook: Webhook) -> None:
    assert set(admission_metrics(webhook).values()) == {(0.0, 0.0)}  # every series, before any review
    webhook.engine.set_limits(f"root.{NAMESPACE}", {"pods": 1})
    manifest = pod()
    assert webhook.admit(review(manifest))["allowed"] is True
    assert webhook.admit(review(pod()))["allowed"] is False  # the second pod is over pods: 1
    assert webhook.admit(review(pod(), dry_run=True))["allowed"] is False
    assert webhook.admit(review(pod(), dry_run=True))["allowed"] is False
    assert webhook.admit(review(manifest, operation="DELETE"))["allowed"] is True
    with webhook.client() as http:
        assert http.post("/v1/admission/pods", content=b"{not json").status_code == 400
    assert admission_metrics(webhook) == {
        "allowed": (1.0, 1.0),
        "refused": (1.0, 1.0),
        "dry_run": (2.0, 2.0),
        "not_pod_create": (1.0, 1.0),
        "error": (1.0, 1.0),
    }


def test_an_internal_error_is_counted_as_an_error(webhook: Webhook, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(webhook.engine, "admit_pod", broken)
    with webhook.client() as http:
        assert http.post("/v1/admission/pods", json=review(pod())).status_code == 500
    counted = admission_metrics(webhook)
    assert counted["error"] == (1.0, 1.0)
    assert counted["allowed"] == counted["refused"] == (0.0, 0.0)
