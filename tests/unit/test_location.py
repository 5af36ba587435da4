"""Where the default ledger lives, and which URLs name a SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from quota_ledger import InvalidRequest, LedgerMissing
from quota_ledger.runtime import location


def test_the_default_ledger_is_in_the_xdg_data_directory() -> None:
    assert location.default_file({"XDG_DATA_HOME": "/srv/data"}) == Path("/srv/data/quota-ledger/ledger.db")
    assert (
        location.default_db_url({"XDG_DATA_HOME": "/srv/data"})
        == "sqlite:////srv/data/quota-ledger/ledger.db"
    )
    fallback = Path.home() / ".local" / "share" / "quota-ledger" / "ledger.db"
    assert location.default_file({}) == fallback
    assert location.default_file({"XDG_DATA_HOME": ""}) == fallback
    assert location.default_file({"XDG_DATA_HOME": "relative/dir"}) == fallback  # the spec ignores it


def test_only_sqlite_files_are_files() -> None:
    assert location.sqlite_file("sqlite:////tmp/x/l.db") == Path("/tmp/x/l.db")
    assert location.sqlite_file("sqlite:///l.db") == Path.cwd() / "l.db"
    assert location.sqlite_file("sqlite://") is None
    assert location.sqlite_file("sqlite:///:memory:") is None
    assert location.sqlite_file("postgresql://u:secret@db/ledger") is None
    assert location.describe("postgresql://u:secret@db/ledger") == "postgresql://u:***@db/ledger"
    with pytest.raises(InvalidRequest) as refused:
        location.sqlite_file("not a url")
    assert refused.value.field == "db"


def test_a_missing_file_is_refused_and_not_created(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sub' / 'l.db'}"
    with pytest.raises(LedgerMissing) as refused:
        location.require_existing(url)
    assert refused.value.path == tmp_path / "sub" / "l.db"
    assert list(tmp_path.iterdir()) == []
    location.prepare(url)
    assert (tmp_path / "sub").is_dir()
    location.require_existing("postgresql://db/ledger")  # nothing to check on a server


def test_several_urls_are_no_file_and_are_described_each() -> None:
    several = "postgresql://u:secret@db1/ledger  postgresql://u:secret@db2/ledger"
    assert location.sqlite_file(several) is None
    assert location.describe(several) == "postgresql://u:***@db1/ledger postgresql://u:***@db2/ledger"
    with pytest.raises(InvalidRequest):
        location.sqlite_file("postgresql://db1/ledger not-a-url")
