"""Loading the upstream test tables kept in ``data/`` and asserting agreement or a known difference.

Every ported case keeps the name of its upstream file and test function. A case where the
ledger differs on purpose is listed with the reason (and in docs/conformance.md): its test
asserts that the outcome *differs*, so a difference that disappears is noticed too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

DATA = Path(__file__).parent / "data"


def load(name: str) -> dict[str, Any]:
    """A data file: ``repository``, ``commit``, ``file`` and ``cases``."""
    with open(DATA / name, encoding="utf-8") as file:
        loaded = yaml.safe_load(file)
    assert isinstance(loaded, dict)
    return loaded


def params(
    cases: Iterable[Mapping[str, Any]], differences: Mapping[tuple[str, str], str] | None = None
) -> list[Any]:
    """pytest params ``(case, reason)``: ``reason`` is None unless the ledger differs on purpose."""
    differences = differences or {}
    found = []
    for case in cases:
        key = (str(case["test"]), str(case["case"]))
        reason = differences.get(key)
        suffix = "-differs" if reason else ""
        found.append(pytest.param(case, reason, id=f"{key[0]}-{key[1]}{suffix}"))
    unknown = set(differences) - {(str(c["test"]), str(c["case"])) for c in cases}
    assert not unknown, f"differences listed for cases that do not exist: {unknown}"
    return found


def agree(same: bool, reason: str | None, detail: object) -> None:
    """Assert the outcome is upstream's, or, for a known difference, that it is not."""
    if reason is None:
        assert same, detail
    else:
        assert not same, f"this case no longer differs from upstream ({reason}): {detail}"
