"""The ledger on a PostgreSQL primary with a hot standby, synchronous and asynchronous: written on
the primary and read on the standby, refused (typed) on the standby, and written on the standby
once it is promoted after the primary was killed with ``kill -9``.

The steps run in order in one test per mode, on one pair (fixture ``replication``)."""

from __future__ import annotations

import pytest
from pg_replication import PgReplication
from polling import eventually

from quota_ledger import DatabaseUnavailable, QuotaEngine, Usage

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def urls(replication: PgReplication) -> tuple[str, str]:
    """A database migrated on the primary and replayed on the standby: (primary, standby)."""
    primary, standby = replication.create_database("ledger")
    with QuotaEngine.from_url(primary) as engine:
        engine.migrate()
    replication.wait_replayed()
    return primary, standby


def _usage(url: str, queue: str) -> dict[str, Usage]:
    with QuotaEngine.from_url(url) as engine:
        return engine.usage(queue)


def _writes_on_the_primary_are_read_on_the_standby(urls: tuple[str, str]) -> None:
    primary, standby = urls
    with QuotaEngine.from_url(primary) as writer:
        writer.set_limits("root.team", {"fpga": 10})
        made = writer.reserve("root.team", {"fpga": 3}, key="job-1")
        writer.commit(made.id)
        writer.reserve("root.team", {"fpga": 2})
        expected = writer.usage("root.team")
    assert expected["fpga"] == Usage(in_use=3, reserved=2, limit=10)
    assert eventually(lambda: _usage(standby, "root.team"), expected) == expected
    with QuotaEngine.from_url(standby) as reader:
        assert reader.get_by_key("job-1").id == made.id
        assert reader.audit() == []


def _the_standby_refuses_writes_with_a_ledger_error(urls: tuple[str, str]) -> None:
    # Retried like a lost connection (the standby may be about to be promoted): a short budget.
    with (
        QuotaEngine.from_url(urls[1], retry_attempts=2) as engine,
        pytest.raises(DatabaseUnavailable, match="ReadOnlySqlTransaction"),
    ):
        engine.reserve("root.team", {"fpga": 1})


def _the_promoted_standby_takes_writes_after_the_primary_is_killed(
    replication: PgReplication, urls: tuple[str, str]
) -> None:
    primary, standby = urls
    with QuotaEngine.from_url(primary) as writer:
        pending = writer.reserve("root.team", {"fpga": 1}, key="before-kill")
    replication.wait_replayed()
    replication.kill_primary()
    replication.promote()
    assert replication.standby is not None
    assert not replication.in_recovery(replication.standby)
    with QuotaEngine.from_url(standby) as engine:
        assert engine.commit(pending.id).state.value == "committed"
        engine.reserve("root.team", {"fpga": 4})
        assert engine.usage("root.team")["fpga"] == Usage(in_use=4, reserved=6, limit=10)
        assert engine.audit() == []


def test_a_standby_is_read_refuses_writes_and_takes_them_once_promoted(
    replication: PgReplication, urls: tuple[str, str]
) -> None:
    """One test per mode, in steps that build on each other, so that a parallel run starts one
    primary and standby per mode."""
    _writes_on_the_primary_are_read_on_the_standby(urls)
    _the_standby_refuses_writes_with_a_ledger_error(urls)
    _the_promoted_standby_takes_writes_after_the_primary_is_killed(replication, urls)
