"""The service's settings of group commit: environment, command line and the engine built."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from quota_ledger import QuotaEngine
from quota_ledger.cli import parser
from quota_ledger.runtime.settings import Settings


def test_the_service_batches_by_default() -> None:
    settings = Settings(db="sqlite://")  # type: ignore[call-arg]
    assert (settings.engine_options()["batching"], settings.engine_options()["max_batch"]) == (True, 256)
    engine = QuotaEngine.from_url(settings.db_urls, **settings.engine_options())
    try:
        assert engine.group_commit is not None
        assert engine.group_commit.max_batch == 256
    finally:
        engine.close()


def test_batching_and_max_batch_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUOTA_LEDGER_BATCHING", "false")
    monkeypatch.setenv("QUOTA_LEDGER_MAX_BATCH", "64")
    settings = Settings(db="sqlite://")  # type: ignore[call-arg]
    assert (settings.batching, settings.max_batch) == (False, 64)
    engine = QuotaEngine.from_url(settings.db_urls, **settings.engine_options())
    try:
        assert engine.group_commit is None
    finally:
        engine.close()


@pytest.mark.parametrize("value", ["0", "-1", "many", "10001"])
def test_a_max_batch_out_of_range_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("QUOTA_LEDGER_MAX_BATCH", value)
    with pytest.raises(ValidationError, match="max_batch"):
        Settings(db="sqlite://")  # type: ignore[call-arg]


def test_serve_takes_batching_flags() -> None:
    on = parser.build().parse_args(["serve", "--batching", "--max-batch", "32"])
    assert (on.batching, on.max_batch) == (True, 32)
    assert parser.build().parse_args(["serve", "--no-batching"]).batching is False
    unset = parser.build().parse_args(["serve"])
    assert (unset.batching, unset.max_batch) == (None, None)
