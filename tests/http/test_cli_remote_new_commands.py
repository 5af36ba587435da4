"""The CLI through the service (``--url``): ``limits set`` warns about a likely typo, a
partition with ``unknownnames: refuse`` refuses a reservation naming one (exit 1), and
``reservations`` and ``prune`` work as on the database, within the token's scope."""

from __future__ import annotations

import json

from http_support import Service
from test_cli_remote import cli
from test_unknown_names_api import CONFIG, VCORES, YAML


def test_the_cli_warns_and_is_refused_through_the_service(service: Service) -> None:
    with service.client("admin") as api:
        assert api.put("/v1/config", content=CONFIG.format(setting="warn"), headers=YAML).is_success
    warned = cli(service, "limits", "set", "root.dev", "vcores=10")
    assert warned.returncode == 0, warned.stderr
    assert f"warning: {VCORES}" in warned.stderr
    assert "vcores" in warned.stdout
    with service.client("admin") as api:
        assert api.put("/v1/config", content=CONFIG.format(setting="refuse"), headers=YAML).is_success
    refused = cli(service, "reserve", "root.dev", "gpus=1", "--json")
    assert refused.returncode == 1
    error = json.loads(refused.stderr)
    assert error["error"] == "UnknownResource"
    assert "did you mean `nvidia.com/gpu`?" in error["message"]


def test_reservations_and_prune_through_the_service(service: Service) -> None:
    made = json.loads(cli(service, "reserve", "root.a.x", "fpga=1", "--json", role="service").stdout)
    cli(service, "reserve", "root.b", "fpga=1", role="service")
    mine = json.loads(cli(service, "reservations", "--json", role="team-a").stdout)
    assert [r["id"] for r in mine["reservations"]] == [made["id"]]
    assert "root.a.x" in cli(service, "reservations", "--queue", "root.a", role="reader").stdout
    cli(service, "rollback", made["id"], role="service")
    assert "would prune 1 counter" in cli(service, "prune", role="reader").stdout
    assert "pruned 1 counter" in cli(service, "prune", "--apply").stdout
    denied = cli(service, "prune", "--apply", role="reader")
    assert denied.returncode == 1
    assert "403" in denied.stderr
