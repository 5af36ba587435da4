"""``quota-ledger kube webhook-config`` prints the webhook registration of
deploy/kubernetes/webhook/validating-webhook.yaml for a given install: the same document, with
the service, the namespace and the CA bundle filled in, valid for the API, and made from its
arguments alone (no database)."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from quota_ledger.cli import app
from quota_ledger.kube import webhook
from quota_ledger.model.errors import InvalidRequest

MANIFEST = Path(__file__).resolve().parents[2] / "deploy/kubernetes/webhook/validating-webhook.yaml"
CA = b"-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIUQ2E=\n-----END CERTIFICATE-----\n"


def _manifest() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return doc


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    path = tmp_path / "ca.crt"
    path.write_bytes(CA)
    return path


def _print(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert app.main(["kube", "webhook-config", *argv]) == 0
    doc: dict[str, Any] = yaml.safe_load(capsys.readouterr().out)
    return doc


def _filled(service: str, namespace: str, ca: bytes) -> dict[str, Any]:
    """The manifest, with what webhook-config fills in put in by hand."""
    expected = copy.deepcopy(_manifest())
    expected["metadata"]["name"] = service
    (hook,) = expected["webhooks"]
    hook["clientConfig"]["service"] |= {"name": service, "namespace": namespace}
    hook["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
    (selector,) = hook["namespaceSelector"]["matchExpressions"]
    selector["values"] = ["kube-system", namespace]
    return expected


def test_the_default_install_is_the_manifest_itself() -> None:
    install = webhook.WebhookInstall(service="quota-ledger", namespace="quota-ledger")
    assert webhook.configuration(install) == _manifest()


def test_it_prints_the_manifest_with_the_install_filled_in(
    capsys: pytest.CaptureFixture[str], ca_file: Path
) -> None:
    printed = _print(capsys, "--service", "ledger", "--namespace", "infra", "--ca-bundle", str(ca_file))
    assert printed == _filled("ledger", "infra", CA)


def test_what_it_prints_is_valid_for_the_api_strictly(
    capsys: pytest.CaptureFixture[str], ca_file: Path
) -> None:
    printed = _print(capsys, "--service", "ledger", "--namespace", "infra", "--ca-bundle", str(ca_file))
    for version in ("1.32", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(printed, version, strict=True)
    assert base64.b64decode(printed["webhooks"][0]["clientConfig"]["caBundle"]) == CA


def test_the_failure_policy_timeout_path_and_name_are_options(
    capsys: pytest.CaptureFixture[str], ca_file: Path
) -> None:
    printed = _print(
        capsys,
        "--service=ledger",
        "--namespace=infra",
        f"--ca-bundle={ca_file}",
        "--failure-policy=Ignore",
        "--timeout-seconds=10",
        "--path=/ledger/v1/admission/pods",
        "--name=ledger-infra",
    )
    (hook,) = printed["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] == 10
    assert hook["clientConfig"]["service"]["path"] == "/ledger/v1/admission/pods"
    assert printed["metadata"]["name"] == "ledger-infra"
    kubernetes_validate.validate(printed, "1.32", strict=True)


def test_it_needs_no_database(
    capsys: pytest.CaptureFixture[str], ca_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nowhere" / "ledger.db"
    monkeypatch.setenv("QUOTA_LEDGER_DB", f"sqlite:///{missing}")
    printed = _print(capsys, "--service", "ledger", "--namespace", "infra", "--ca-bundle", str(ca_file))
    assert printed["kind"] == "ValidatingWebhookConfiguration"
    assert not missing.parent.exists()


def test_the_ledgers_namespace_is_left_out_once_even_when_it_is_kube_system(
    capsys: pytest.CaptureFixture[str], ca_file: Path
) -> None:
    printed = _print(capsys, "--service", "ledger", "--namespace", "kube-system", "--ca-bundle", str(ca_file))
    (selector,) = printed["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    assert selector["values"] == ["kube-system"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--service", "Ledger"], "not a DNS label"),
        (["--namespace", "in_fra"], "not a DNS label"),
        (["--timeout-seconds", "31"], "between 1 and 30"),
        (["--timeout-seconds", "0"], "between 1 and 30"),
        (["--failure-policy", "Allow"], "invalid choice"),
        (["--path", "v1/admission/pods"], "starts with /"),
    ],
)
def test_a_bad_option_is_bad_usage(
    capsys: pytest.CaptureFixture[str], ca_file: Path, argv: list[str], message: str
) -> None:
    given = {"--service": "ledger", "--namespace": "infra", "--ca-bundle": str(ca_file)}
    given |= dict(zip(argv[::2], argv[1::2], strict=True))
    assert _exit_code(["kube", "webhook-config", *(word for pair in given.items() for word in pair)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""


def _exit_code(argv: list[str]) -> int:
    """What the command exits with: argparse's own refusals raise SystemExit."""
    try:
        return app.main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def test_a_ca_bundle_that_is_missing_or_holds_no_certificate_is_bad_usage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nMC4CAQ==\n-----END PRIVATE KEY-----\n")
    for path, message in ((tmp_path / "absent.crt", "cannot read"), (key, "no PEM certificate")):
        argv = ["kube", "webhook-config", "--service", "s", "--namespace", "n", "--ca-bundle", str(path)]
        assert _exit_code(argv) == 2
        assert message in capsys.readouterr().err


def test_the_library_refuses_what_the_api_server_would() -> None:
    for install in (
        webhook.WebhookInstall(service="a.b", namespace="n"),
        webhook.WebhookInstall(service="s", namespace="n", timeout_seconds=45),
        webhook.WebhookInstall(service="s", namespace="n", path="relative"),
        webhook.WebhookInstall(service="s", namespace="n", ca_bundle=b"not pem"),
    ):
        with pytest.raises(InvalidRequest):
            webhook.configuration(install)
