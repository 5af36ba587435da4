"""A database the CLI cannot reach: the host and the driver's reason, at once, never a password."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import URL
from test_cli import cli

from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.model.errors import DatabaseUnavailable, DatabaseUnreachable


@pytest.mark.parametrize(
    "url", ["postgresql://nobody:hunter2@127.0.0.1:1/x", "mysql://nobody:hunter2@127.0.0.1:1/x"]
)
def test_a_refused_connection_is_named_at_once_without_the_password(url: str) -> None:
    result = cli("--db", url, "usage")
    assert result.returncode == 1
    assert "nobody@127.0.0.1:1/x" in result.stderr
    assert "connection refused" in result.stderr
    assert "hunter2" not in result.stderr
    # Given up on the first attempt, not after the 14 s of ten (a wall clock is unreliable here:
    # a loaded machine takes seconds to start the interpreter).
    assert "gave up after 1 attempt" in result.stderr
    verbose = cli("-v", "--db", url, "usage")
    assert "connection refused" in verbose.stderr
    assert "hunter2" not in verbose.stderr


def test_the_library_retries_a_refused_connection_unless_told_not_to() -> None:
    url = "postgresql://nobody:hunter2@127.0.0.1:1/x"
    patient = DbQuotaDriver.from_url(url, retry_attempts=3, retry_seconds=30)
    with pytest.raises(DatabaseUnreachable) as caught:
        patient.partitions()
    assert caught.value.attempts == 3
    assert not caught.value.permanent
    assert isinstance(caught.value, DatabaseUnavailable)
    assert "hunter2" not in str(caught.value)
    patient.dispose()
    hasty = DbQuotaDriver.from_url(url, retry_attempts=3, retry_refused=False)
    with pytest.raises(DatabaseUnreachable) as caught:
        hasty.partitions()
    assert caught.value.attempts == 1
    assert caught.value.reason == "connection refused"
    hasty.dispose()


def test_an_unknown_database_is_not_retried(server_db_url: URL) -> None:
    missing = server_db_url.set(database="no_such_ledger_database", password="hunter2")
    result = cli("--db", missing.render_as_string(hide_password=False), "usage")
    assert result.returncode == 1
    assert "no_such_ledger_database" in result.stderr
    assert "retrying cannot fix this" in result.stderr
    assert "hunter2" not in result.stderr
    driver = DbQuotaDriver.from_url(missing, retry_attempts=5)
    with pytest.raises(DatabaseUnreachable) as caught:
        driver.partitions()
    assert caught.value.permanent
    assert caught.value.attempts == 1
    driver.dispose()
