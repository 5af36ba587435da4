"""``quota-ledger serve`` refuses a client CA it could not use: ``QUOTA_LEDGER_TLS_CLIENT_CA``
asks TLS clients for a certificate, and without a certificate and key of its own the service
would speak plain HTTP, where none is ever presented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quota_ledger.cli.exit_codes import EXIT_ERROR
from quota_ledger.runtime.settings import Settings, UnusableSetting


def serve(tmp_path: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """``quota-ledger serve`` on a SQLite ledger in ``tmp_path``, with no QUOTA_LEDGER_* variable
    but ``settings``; a service that starts is stopped by the timeout, failing the test."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("QUOTA_LEDGER_")}
    env.update({f"QUOTA_LEDGER_{name.upper()}": value for name, value in settings.items()})
    command = [sys.executable, "-m", "quota_ledger.cli", "--db", f"sqlite:///{tmp_path / 'ledger.db'}"]
    return subprocess.run(
        [*command, *args, "serve", "--port", "0", "--no-sweep"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_a_client_ca_without_a_certificate_stops_serve_with_exit_1(tmp_path: Path) -> None:
    (tmp_path / "client-ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    done = serve(tmp_path, tls_client_ca=str(tmp_path / "client-ca.pem"))
    assert done.returncode == EXIT_ERROR
    assert "serving on" not in done.stdout
    assert done.stderr.startswith("error: QUOTA_LEDGER_TLS_CLIENT_CA is set but the service would serve")
    assert "--tls-certfile" in done.stderr


def test_the_refusal_is_typed_in_json(tmp_path: Path) -> None:
    done = serve(tmp_path, "--json", tls_client_ca=str(tmp_path / "client-ca.pem"))
    assert done.returncode == EXIT_ERROR
    assert json.loads(done.stderr)["error"] == "UnusableSetting"


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ({"tls_client_ca": "ca.pem"}, True),
        ({"tls_client_ca": "ca.pem", "tls_certfile": "cert.pem"}, True),
        ({"tls_client_ca": "ca.pem", "tls_certfile": "cert.pem", "tls_keyfile": "key.pem"}, False),
        ({"tls_certfile": "cert.pem", "tls_keyfile": "key.pem"}, False),
        ({}, False),
    ],
)
def test_check_serving_refuses_a_client_ca_without_a_certificate_and_key(
    given: dict[str, str], refused: bool
) -> None:
    settings = Settings(db="sqlite://", **given)  # type: ignore[call-arg]
    if not refused:
        settings.check_serving()
        return
    with pytest.raises(UnusableSetting) as caught:
        settings.check_serving()
    assert (caught.value.setting, caught.value.needs) == ("tls_client_ca", ("tls_certfile", "tls_keyfile"))
