"""The Kubernetes manifests under deploy/kubernetes: every document is valid for the API (checked
strictly against the schemas kubernetes-validate ships, offline), the kustomizations build, and
the facts the operator relies on hold: two replicas ready on /readyz, the restricted pod
security settings, the webhook's sideEffects, timeout and match policy, kube-system and the
ledger's own namespace left out, the least RBAC verbs, and no Secret with a value."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from quota_ledger.reconciler.settings import ReconcilerSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
#: the oldest Kubernetes the manifests are checked against, and the newest schemas shipped
KUBERNETES_VERSIONS = ("1.32", kubernetes_validate.latest_version())
#: kinds of API groups kubernetes-validate has no schema for, checked by hand below
CUSTOM_GROUPS = ("cert-manager.io/",)
#: a template, not applied by the kustomization: copied and filled in by the operator
TEMPLATES = {"secret.example.yaml"}
NAMESPACE = "quota-ledger"
SERVICE_ACCOUNT = "quota-ledger"
RECONCILER_ACCOUNT = "quota-ledger-reconciler"
#: the Lease the reconciler's replicas elect a leader on (its --lease-name default)
LEASE = "quota-ledger-reconciler"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _manifest_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml")


def _all() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in _manifest_files() for doc in _documents(path)]


def _of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in _all() if doc["kind"] == kind]


def _named(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [doc for doc in _of_kind(kind) if doc["metadata"]["name"] == name]
    return doc


def _id(path: Path, doc: dict[str, Any]) -> str:
    return f"{path.relative_to(DEPLOY)}:{doc['kind']}/{doc['metadata']['name']}"


def _validate_strictly(doc: dict[str, Any]) -> None:
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def test_every_manifest_is_valid_for_the_api_strictly() -> None:
    checked = 0
    for path, doc in _all():
        if doc["apiVersion"].startswith(CUSTOM_GROUPS):
            continue
        try:
            _validate_strictly(doc)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{_id(path, doc)}: {error.caught}")
        checked += 1
    assert checked >= 15


def test_a_strict_check_refuses_a_field_the_api_does_not_know() -> None:
    deployment = _named("Deployment", "quota-ledger")
    wrong = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_strictly(wrong)


def test_the_cert_manager_objects_name_the_secret_the_service_mounts_and_its_dns_names() -> None:
    certificate = _named("Certificate", "quota-ledger-tls")
    assert certificate["apiVersion"] == "cert-manager.io/v1"
    assert certificate["spec"]["secretName"] == _tls_secret_name()
    assert f"{NAMESPACE}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    issuer = certificate["spec"]["issuerRef"]
    assert _named(issuer["kind"], issuer["name"])["spec"] == {"selfSigned": {}}
    (webhook_patch,) = _kustomization(DEPLOY / "cert-manager")["patches"]
    assert f"cert-manager.io/inject-ca-from: {NAMESPACE}/quota-ledger-tls" in webhook_patch["patch"]


# --- the kustomizations ------------------------------------------------------------------------


def _kustomization(directory: Path) -> dict[str, Any]:
    (doc,) = _documents(directory / "kustomization.yaml")
    return doc


def _kustomize_dirs() -> list[Path]:
    return sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))


@pytest.mark.parametrize("directory", _kustomize_dirs(), ids=lambda p: str(p.relative_to(DEPLOY)) or "base")
def test_a_kustomization_lists_every_manifest_of_its_directory_and_nothing_missing(directory: Path) -> None:
    kustomization = _kustomization(directory)
    listed = kustomization.get("resources", [])
    for entry in [*listed, *kustomization.get("components", [])]:
        assert (directory / entry).exists(), f"{entry} is listed but missing"
    files = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"} - TEMPLATES
    assert files == {entry for entry in listed if entry.endswith(".yaml")}


def test_the_secret_template_is_not_applied_by_the_kustomization() -> None:
    assert "secret.example.yaml" not in _kustomization(DEPLOY)["resources"]


def _kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl (with its kustomize) is not installed")
    return found


def _build(tmp_path: Path, components: list[str]) -> list[dict[str, Any]]:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(DEPLOY, overlay)  # kustomize refuses absolute paths
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "components": [f"{base}/{name}" for name in components],
        # as docs/running-in-kubernetes.md's overlay names the image that was built and pushed
        "images": [
            {"name": "quota-ledger", "newName": "registry.example.com/quota-ledger", "newTag": "9.9.9"}
        ],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    built = subprocess.run(
        [_kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, check=False, timeout=120
    )
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc is not None]


def test_the_base_with_every_component_builds_into_valid_objects(tmp_path: Path) -> None:
    docs = _build(tmp_path, ["cert-manager", "reconciler-write-status"])
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds.count("Deployment") == 2
    assert "ValidatingWebhookConfiguration" in kinds
    assert "Secret" not in kinds  # the operator creates it, from the template or kubectl
    for doc in docs:
        if not doc["apiVersion"].startswith(CUSTOM_GROUPS):
            _validate_strictly(doc)
    (reconciler,) = [
        d for d in docs if d["metadata"]["name"] == "quota-ledger-reconciler" and d["kind"] == "Deployment"
    ]
    assert reconciler["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "kube",
        "reconcile",
        "--write-status",
    ]
    images = {
        container["image"]
        for doc in docs
        if doc["kind"] in ("Deployment", "Job")
        for container in doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example.com/quota-ledger:9.9.9"}
    (webhook,) = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    assert webhook["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/quota-ledger-tls"
    }


def test_the_base_runs_the_service_and_the_reconciler_and_registers_no_webhook(tmp_path: Path) -> None:
    docs = _build(tmp_path, [])
    assert sorted((doc["kind"], doc["metadata"]["name"]) for doc in docs) == sorted(
        [
            ("Namespace", NAMESPACE),
            ("ServiceAccount", SERVICE_ACCOUNT),
            ("Job", "quota-ledger-migrate"),
            ("Deployment", "quota-ledger"),
            ("Service", "quota-ledger"),
            ("PodDisruptionBudget", "quota-ledger"),
            ("ServiceAccount", RECONCILER_ACCOUNT),
            ("ClusterRole", "quota-ledger-reconciler"),
            ("ClusterRoleBinding", "quota-ledger-reconciler"),
            ("Role", "quota-ledger-reconciler-leader-election"),
            ("RoleBinding", "quota-ledger-reconciler-leader-election"),
            ("Deployment", "quota-ledger-reconciler"),
        ]
    )


# --- the workloads -------------------------------------------------------------------------------


def _workloads() -> list[dict[str, Any]]:
    return _of_kind("Deployment") + _of_kind("Job")


def _version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


@pytest.mark.parametrize("workload", _workloads(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_pod_meets_the_restricted_pod_security_standard(workload: dict[str, Any]) -> None:
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    for container in pod["containers"] + pod.get("initContainers", []):
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["runAsNonRoot"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["image"] == f"quota-ledger:{_version()}"
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert "memory" in container["resources"]["limits"]
        # the read-only root leaves /tmp, where Python and the CLI write, to an emptyDir
        (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
        assert "emptyDir" in volume
        # the database URL comes from the Secret, never from the manifest
        (db,) = [e for e in container["env"] if e["name"] == "QUOTA_LEDGER_DB"]
        assert db["valueFrom"]["secretKeyRef"] == {"name": "quota-ledger", "key": "db"}


def test_the_service_runs_two_replicas_ready_on_readyz_over_https() -> None:
    deployment = _named("Deployment", "quota-ledger")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["serve", "--no-migrate"]  # the Job migrates, once
    readiness = container["readinessProbe"]["httpGet"]
    liveness = container["livenessProbe"]["httpGet"]
    assert readiness == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert liveness == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("https", int(env["QUOTA_LEDGER_PORT"]))
    assert env["QUOTA_LEDGER_HOST"] == "0.0.0.0"
    tls = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["tls"]
    assert env["QUOTA_LEDGER_TLS_CERTFILE"] == f"{tls}/tls.crt"
    assert env["QUOTA_LEDGER_TLS_KEYFILE"] == f"{tls}/tls.key"
    assert {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]["secretName"] == _tls_secret_name()
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert spread["kubernetes.io/hostname"]["labelSelector"] == deployment["spec"]["selector"]
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT
    assert pod["automountServiceAccountToken"] is False


def _tls_secret_name() -> str:
    pod = _named("Deployment", "quota-ledger")["spec"]["template"]["spec"]
    name: str = {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]["secretName"]
    return name


def test_the_service_sends_port_443_to_the_replicas_https_port_and_a_drain_keeps_one() -> None:
    deployment = _named("Deployment", "quota-ledger")
    service = _named("Service", "quota-ledger")
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (443, "https")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    budget = _named("PodDisruptionBudget", "quota-ledger")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]


def test_the_schema_is_migrated_by_a_job_that_runs_db_upgrade() -> None:
    job = _named("Job", "quota-ledger-migrate")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["db", "upgrade"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0  # so that the next apply can create it anew


def test_the_reconciler_runs_two_replicas_of_kube_reconcile_as_its_own_account() -> None:
    deployment = _named("Deployment", "quota-ledger-reconciler")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"] == ["kube", "reconcile"]
    assert pod["serviceAccountName"] == RECONCILER_ACCOUNT
    env = {e["name"]: e.get("valueFrom", {}) for e in pod["containers"][0]["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # its settings come from QUOTA_LEDGER_RECONCILE_* variables the reconciler knows
    settings = {
        e["name"] for e in pod["containers"][0]["env"] if e["name"].startswith("QUOTA_LEDGER_RECONCILE_")
    }
    known = {f"QUOTA_LEDGER_RECONCILE_{name.upper()}" for name in ReconcilerSettings.model_fields}
    assert settings <= known
    (port,) = pod["containers"][0]["ports"]
    metrics_port = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}[
        "QUOTA_LEDGER_RECONCILE_METRICS_PORT"
    ]
    assert port["containerPort"] == int(metrics_port)


def test_every_namespaced_object_is_in_the_ledgers_namespace() -> None:
    cluster_wide = {"Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration"}
    for path, doc in _all():
        if doc["kind"] not in cluster_wide:
            assert doc["metadata"]["namespace"] == NAMESPACE, _id(path, doc)


# --- RBAC ------------------------------------------------------------------------------------------

#: (API group, resource, verb) for each account, nothing more: the service calls no API
LEAST = {
    RECONCILER_ACCOUNT: {
        *(
            ("", resource, verb)
            for resource in ("pods", "namespaces", "resourcequotas")
            for verb in ("get", "list", "watch")
        ),
        *(("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")),
        ("", "resourcequotas/status", "update"),
        ("", "resourcequotas/status", "patch"),
    },
}


def _granted() -> dict[str, set[tuple[str, str, str]]]:
    roles = {
        (doc["kind"], doc["metadata"]["name"]): doc for doc in _of_kind("Role") + _of_kind("ClusterRole")
    }
    granted: dict[str, set[tuple[str, str, str]]] = {}
    for binding in _of_kind("RoleBinding") + _of_kind("ClusterRoleBinding"):
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        if binding["kind"] == "RoleBinding" and role["kind"] == "Role":
            assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == NAMESPACE
        for subject in binding["subjects"]:
            assert (subject["kind"], subject["namespace"]) == ("ServiceAccount", NAMESPACE)
            rules = granted.setdefault(subject["name"], set())
            for rule in role["rules"]:
                rules |= {
                    (group, resource, verb)
                    for group in rule["apiGroups"]
                    for resource in rule["resources"]
                    for verb in rule["verbs"]
                }
    return granted


def test_rbac_grants_exactly_the_least_verbs_and_the_service_none() -> None:
    assert _granted() == LEAST
    assert SERVICE_ACCOUNT not in _granted()
    assert _named("ServiceAccount", SERVICE_ACCOUNT)["automountServiceAccountToken"] is False


def test_no_rule_uses_a_wildcard_or_names_secrets() -> None:
    for doc in _of_kind("Role") + _of_kind("ClusterRole"):
        for rule in doc["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], doc["metadata"]["name"]
            assert "secrets" not in rule["resources"]


def test_writing_quota_status_is_granted_only_by_its_own_component() -> None:
    status = [
        (path, doc)
        for path, doc in _all()
        if doc["kind"] == "ClusterRole"
        and any("resourcequotas/status" in rule["resources"] for rule in doc["rules"])
    ]
    assert [path.parent.name for path, _ in status] == ["reconciler-write-status"]
    for directory in (DEPLOY, DEPLOY / "reconciler"):  # an option, never in the base
        assert "reconciler-write-status" not in str(_kustomization(directory))


def test_leases_are_granted_in_the_ledgers_namespace_only_and_kept_to_the_reconcilers() -> None:
    for doc in _of_kind("ClusterRole"):
        for rule in doc["rules"]:
            assert "leases" not in rule["resources"]
    rules = [rule for doc in _of_kind("Role") for rule in doc["rules"] if "leases" in rule["resources"]]
    for rule in rules:
        # a create names no object yet; what exists is read and renewed by name only
        assert rule.get("resourceNames") == (None if rule["verbs"] == ["create"] else [LEASE])
    container = _named("Deployment", "quota-ledger-reconciler")["spec"]["template"]["spec"]["containers"][0]
    assert "--lease-name" not in container["args"]  # the reconciler's default is the Lease above
    assert ReconcilerSettings.model_fields["lease_name"].default == LEASE


# --- Secrets -----------------------------------------------------------------------------------------


def test_no_secret_holds_a_value() -> None:
    secrets = _of_kind("Secret")
    assert secrets
    for secret in secrets:
        assert "data" not in secret
        assert set(secret["stringData"]) == {"db", "read-db"}
        assert all(value == "" for value in secret["stringData"].values())


def test_the_workloads_read_only_keys_the_secret_template_has() -> None:
    (template,) = _of_kind("Secret")
    for workload in _workloads():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            for env in container["env"]:
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["name"] == template["metadata"]["name"]
                    assert ref["key"] in template["stringData"]


# --- the webhook -----------------------------------------------------------------------------------


def test_the_webhook_is_called_for_pod_creation_outside_kube_system_and_the_ledger() -> None:
    configuration = _named("ValidatingWebhookConfiguration", "quota-ledger")
    (webhook,) = configuration["webhooks"]
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["sideEffects"] == "NoneOnDryRun"
    assert webhook["timeoutSeconds"] == 5
    assert webhook["matchPolicy"] == "Equivalent"
    assert webhook["failurePolicy"] == "Fail"
    (rule,) = webhook["rules"]
    assert (rule["operations"], rule["resources"], rule["apiGroups"]) == (["CREATE"], ["pods"], [""])
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "NotIn"
    assert set(expression["values"]) == {"kube-system", NAMESPACE}
    target = webhook["clientConfig"]["service"]
    service = _named("Service", target["name"])
    assert target["namespace"] == service["metadata"]["namespace"]
    assert target["port"] in [p["port"] for p in service["spec"]["ports"]]
    assert target["path"] == "/v1/admission/pods"
    assert "caBundle" not in webhook["clientConfig"]  # injected, or printed by webhook-config


def _iter_strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _iter_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _iter_strings(item)
    elif isinstance(value, str):
        yield value


def test_no_manifest_holds_a_credential() -> None:
    for path, doc in _all():
        for text in _iter_strings(doc):
            assert "BEGIN" not in text, _id(path, doc)  # no PEM certificate or key
            assert "://" not in text or "@" not in text, _id(path, doc)  # no URL with a user
