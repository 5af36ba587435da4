"""The ValidatingWebhookConfiguration that registers the ledger's admission endpoint with the API
server: the document of ``deploy/kubernetes/webhook/validating-webhook.yaml``, for a given
service, namespace and CA bundle (``quota-ledger kube webhook-config`` prints it)."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any, Literal

from quota_ledger.model.errors import InvalidRequest

#: the service's admission endpoint
DEFAULT_PATH = "/v1/admission/pods"
#: seconds the API server waits for an answer before failurePolicy decides
DEFAULT_TIMEOUT_SECONDS = 5
#: the webhook's name in the configuration (a fully qualified name, as the API server requires)
WEBHOOK_NAME = "pods.quota-ledger.io"
#: namespaces whose pods the webhook never sees, besides the ledger's own
EXCLUDED_NAMESPACES = ("kube-system",)

FailurePolicy = Literal["Fail", "Ignore"]

#: a Service's or a namespace's name (an RFC 1123 label)
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"


@dataclass(frozen=True, kw_only=True)
class WebhookInstall:
    """Where the ledger's service runs, and how the API server should call it."""

    #: the Service in front of the ledger (port 443)
    service: str
    #: its namespace, which the webhook leaves out
    namespace: str
    #: the PEM CA certificate(s) the API server checks the service's certificate against
    #: (None: left out, for cert-manager's CA injector to fill in)
    ca_bundle: bytes | None = None
    #: the configuration's metadata.name (default: the service's name)
    name: str | None = None
    failure_policy: FailurePolicy = "Fail"
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    path: str = DEFAULT_PATH


def configuration(install: WebhookInstall) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration for ``install``: pod creation in every namespace but
    kube-system and the ledger's own is sent to the ledger, dry runs without side effects."""
    for field, value in (("service", install.service), ("namespace", install.namespace)):
        if not _LABEL.match(value):
            raise InvalidRequest(
                f"{field} {value!r} is not a DNS label (a-z, 0-9, -; 63 at most)", field=field
            )
    if install.failure_policy not in ("Fail", "Ignore"):
        raise InvalidRequest("failurePolicy is Fail or Ignore", field="failure_policy")
    if not 1 <= install.timeout_seconds <= 30:
        raise InvalidRequest("timeoutSeconds is between 1 and 30", field="timeout_seconds")
    if not install.path.startswith("/"):
        raise InvalidRequest("the path starts with /", field="path")
    if install.ca_bundle is not None and _PEM_CERTIFICATE not in install.ca_bundle:
        raise InvalidRequest("the CA bundle holds no PEM certificate", field="ca_bundle")
    service: dict[str, Any] = {
        "name": install.service,
        "namespace": install.namespace,
        "path": install.path,
        "port": 443,
    }
    client: dict[str, Any] = {"service": service}
    if install.ca_bundle is not None:
        client["caBundle"] = base64.b64encode(install.ca_bundle).decode("ascii")
    excluded = list(dict.fromkeys([*EXCLUDED_NAMESPACES, install.namespace]))
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": install.name or install.service,
            "labels": {
                "app.kubernetes.io/name": "quota-ledger",
                "app.kubernetes.io/component": "admission-webhook",
                "app.kubernetes.io/part-of": "quota-ledger",
            },
        },
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": client,
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": install.failure_policy,
                "matchPolicy": "Equivalent",
                # the ledger reserves what an admitted pod requests, but not for a dry run
                "sideEffects": "NoneOnDryRun",
                "timeoutSeconds": install.timeout_seconds,
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded}
                    ]
                },
            }
        ],
    }
