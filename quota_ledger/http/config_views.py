"""The configuration in force as the service hands it out: JSON or YAML, by ``Accept``."""

from __future__ import annotations

from typing import Any

import yaml
from fastapi import Response

from quota_ledger.driver.tx import LedgerTx
from quota_ledger.engine import QuotaEngine

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
VERSION_HEADER = "X-Config-Version"


def current(engine: QuotaEngine) -> tuple[int, dict[str, Any]]:
    """The version in force and its document, read in one transaction."""

    def work(tx: LedgerTx) -> tuple[int, dict[str, Any]]:
        version = tx.config_version()
        return version, tx.load_config(version)[0]

    return engine.driver.run(work)


def wants_yaml(accept: str | None) -> bool:
    """Whether the ``Accept`` header lists YAML before JSON (or without it), ``q=0`` excluded."""
    for item in (accept or "").split(","):
        media, *params = (part.strip().lower() for part in item.split(";"))
        if any(p.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for p in params):
            continue
        if media in YAML_TYPES:
            return True
        if media in ("application/json", "application/*", "*/*"):
            return False
    return False


def yaml_response(version: int, document: dict[str, Any]) -> Response:
    """The document as YAML; the version is in a header and a comment, so the body is the plain
    YuniKorn configuration, ready to edit and send back."""
    text = f"# quota-ledger configuration, version {version}\n" + yaml.safe_dump(document, sort_keys=False)
    return Response(content=text, media_type="application/yaml", headers={VERSION_HEADER: str(version)})
