"""Settings from keywords, the environment and a settings file (quota_ledger.env_settings): the
keyword wins, then the environment, then the file, then the default; names match ignoring case;
a bad value is a pydantic ValidationError naming the field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from quota_ledger.reconciler.settings import ReconcilerSettings
from quota_ledger.runtime.settings import Settings


@pytest.fixture(autouse=True)
def no_settings_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.upper().startswith("QUOTA_LEDGER_")]:
        monkeypatch.delenv(name)


def test_a_keyword_wins_over_the_environment_which_wins_over_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    file = tmp_path / "settings.env"
    file.write_text(
        "QUOTA_LEDGER_DB=sqlite:///file.db\nQUOTA_LEDGER_PORT=81\nexport QUOTA_LEDGER_DEFAULT_TTL='42'\n"
    )
    monkeypatch.setenv("QUOTA_LEDGER_PORT", "82")
    settings = Settings(_env_file=str(file), db="sqlite:///given.db")  # type: ignore[call-arg]
    assert (settings.db, settings.port, settings.default_ttl) == ("sqlite:///given.db", 82, 42.0)
    assert Settings(_env_file=file).db == "sqlite:///file.db"  # type: ignore[call-arg]
    assert Settings(db="sqlite://").max_batch == 256  # type: ignore[call-arg]


def test_names_match_ignoring_case_and_others_are_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    file = tmp_path / "settings.env"
    file.write_text(
        "quota_ledger_max_batch=12\nDB=sqlite:///unprefixed.db\nQUOTA_LEDGER_NO_SUCH=1\nQUOTA_LEDGER_HOST\n"
    )
    monkeypatch.setenv("Quota_Ledger_Workers", "3")
    settings = Settings(_env_file=file, no_such_keyword=1)  # type: ignore[call-arg]
    assert (settings.max_batch, settings.workers, settings.host) == (12, 3, "127.0.0.1")
    assert settings.db != "sqlite:///unprefixed.db"


def test_a_settings_file_that_is_not_there_is_skipped(tmp_path: Path) -> None:
    assert Settings(_env_file=tmp_path / "missing.env", db="sqlite://").port == 8080  # type: ignore[call-arg]


def test_a_bad_value_from_either_source_names_its_field(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    file = tmp_path / "settings.env"
    file.write_text("QUOTA_LEDGER_ACCESS_LOG=xml\n")
    with pytest.raises(ValidationError, match="access_log") as from_file:
        Settings(_env_file=file, db="sqlite://")  # type: ignore[call-arg]
    assert from_file.value.title == "Settings"
    assert from_file.value.errors()[0]["input"] == "xml"
    monkeypatch.setenv("QUOTA_LEDGER_POOL_SIZE", "x")
    with pytest.raises(ValidationError, match="pool_size"):
        Settings(db="sqlite://")  # type: ignore[call-arg]


def test_the_reconciler_reads_its_own_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUOTA_LEDGER_RECONCILE_RELIST_EVERY", "60")
    monkeypatch.setenv("QUOTA_LEDGER_RECONCILE_LEADER_ELECTION", "off")
    monkeypatch.setenv("QUOTA_LEDGER_IDENTITY", "not-the-reconciler's")
    settings = ReconcilerSettings(lease_name="given")  # type: ignore[call-arg]
    assert (settings.relist_every, settings.leader_election, settings.lease_name) == (60.0, False, "given")
    assert settings.identity is None


def test_reading_the_settings_does_not_load_pydantic_settings() -> None:
    probe = (
        "import sys\nfrom quota_ledger.runtime.settings import Settings\nSettings(db='sqlite://')\n"
        "print('pydantic_settings' in sys.modules)"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert found.stdout.strip() == "False"
