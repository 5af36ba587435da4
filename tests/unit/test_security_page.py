"""The Security page's limits are the code's: each bound a setting gives is named with its
default, and each fixed one says the value the code holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from quota_ledger.http import admission, app, batch
from quota_ledger.model import validation
from quota_ledger.runtime.settings import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "security.md"
#: the settings that bound a request, a connection or what one caller may hold
BOUNDS = (
    "max_header_bytes",
    "max_headers",
    "header_timeout",
    "keep_alive_timeout",
    "max_connections",
    "max_resources_per_request",
    "max_resources_per_limit_set",
    "max_resources_per_partition",
    "token_cache_seconds",
    "pool_size",
    "max_batch",
    "workers",
    "retry_attempts",
    "retry_seconds",
    "default_ttl",
    "admission_ttl",
)
#: fixed bounds: the start of their row, and the value the code holds, as the page writes it
FIXED = {
    "| request body |": f"{app.MAX_BODY // (1024 * 1024)} MiB",
    "| nesting of a JSON or YAML document |": f"{validation.MAX_DEPTH} levels",
    "| values of a YAML document": f"{validation.MAX_NODES:,}",
    "| operations of one `POST /v1/batch` |": f"{batch.MAX_OPERATIONS:,}",
    "| groups one request names |": f"{validation.MAX_GROUPS}",
    "| a reservation's time to live |": f"{validation.MAX_TTL / 86400:g} days",
    "| database time of one admission review |": f"{admission.DATABASE_SHARE:.0%}".replace("%", " %"),
}


def _shown(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _rows() -> list[str]:
    return [line for line in PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]


@pytest.mark.parametrize("name", BOUNDS)
def test_every_bounding_setting_is_on_the_page_with_its_default(name: str) -> None:
    rows = [row for row in _rows() if f"`{name}`" in row]
    assert rows, f"no row names {name}"
    default = Settings.model_fields[name].default
    assert any(_shown(default) in row for row in rows), f"{name}: default {default} not shown"


@pytest.mark.parametrize("start", FIXED)
def test_every_fixed_bound_on_the_page_is_the_codes(start: str) -> None:
    rows = [row for row in _rows() if row.startswith(start)]
    assert len(rows) == 1, start
    assert FIXED[start] in rows[0]
