"""The PostgreSQL primary killed with ``kill -9`` under load, its synchronous standby promoted:
the engine, given both hosts, finds the new primary by itself, and nothing a caller was told
is lost.

The load (:mod:`ledger_load`, shaped by :func:`pg_failover.shape`) reserves, commits, rolls
back and releases from four threads on queues whose limits refuse some requests; a sampler on
each server reads every limited counter every 100 ms. Every process of the primary is killed
at once, as when its host dies, and the standby is promoted one second later, as a failover
manager would after noticing, so the callers see the outage. Before that, with the standby
among the engine's ``read_urls``, read-only work goes to it and the rest to the primary.
``scripts/cluster pg soak`` is the long form (asynchronous standbys included)."""

from __future__ import annotations

from collections.abc import Iterator

import pg_failover
import pytest
from pg_replication import PgReplication
from sqlalchemy import text

from quota_ledger import QuotaEngine
from quota_ledger.driver.tx import LedgerTx

pytestmark = pytest.mark.cluster

#: seconds the primary serves before it is killed, and the promoted standby after it serves
BEFORE, AFTER = 3.0, 3.0
#: the primary's WAL sender is stopped this long before the kill: an asynchronous standby would
#: then lack what the primary acknowledged meanwhile (hundreds of operations); a synchronous
#: primary acknowledges nothing the standby has not flushed
LAG = 0.5
#: what a caller may see besides refusals: the outage the driver's retries did not ride out
EXPECTED_ERRORS = {"DatabaseUnavailable"}


def _sync_pair() -> Iterator[PgReplication]:
    made = PgReplication(synchronous=True)
    try:
        made.start()
        yield made
    finally:
        made.destroy()


@pytest.fixture(scope="module")
def sync_pair() -> Iterator[PgReplication]:
    """A primary whose ``synchronous_standby_names`` names its streaming standby."""
    yield from _sync_pair()


def _in_recovery(tx: LedgerTx) -> bool:
    return bool(tx.conn.execute(text("SELECT pg_is_in_recovery()")).scalar())


def _reads_go_to_the_read_urls_and_writes_to_the_primary(pair: PgReplication) -> None:
    primary, standby = pair.create_database("routing")
    with QuotaEngine.from_url(primary) as engine:
        engine.migrate()
        engine.set_limits("root.routed", {"fpga": 7})
    pair.wait_replayed()
    with pg_failover.writer_engine(primary, standby, read_urls=[standby]) as engine:
        assert engine.driver.run(_in_recovery, read_only=True) is True
        assert engine.driver.run(_in_recovery) is False
        assert engine.usage("root.routed")["fpga"].limit == 7


def test_a_killed_primary_is_replaced_by_its_synchronous_standby_without_losing_an_acknowledgement(
    sync_pair: PgReplication,
) -> None:
    """Reads routed to the standby first; then the failover under load."""
    _reads_go_to_the_read_urls_and_writes_to_the_primary(sync_pair)
    figures = pg_failover.failover(
        sync_pair, threads=4, before=BEFORE, after=AFTER, promote_delay=1.0, lag=LAG
    )
    _assert_nothing_lost(figures)


def _assert_nothing_lost(figures: pg_failover.Figures) -> None:
    report = "\n".join(figures.lines())
    result = figures.result
    assert result.done["commit"] > 0, report
    assert result.done["release"] > 0, report
    assert result.unexpected == [], report
    assert set(result.errors) <= EXPECTED_ERRORS, report
    assert figures.recovery is not None, report
    assert figures.recovery < 10, report
    assert figures.after is not None, report
    assert figures.after.answered > 0, report
    assert figures.samples["standby"][0] > 0, report
    assert figures.violations == 0, report
    assert figures.lost == [], report
    assert figures.drift == [], report


@pytest.fixture(scope="module")
def second_sync_pair() -> Iterator[PgReplication]:
    """Another synchronous pair (a failover uses one up)."""
    yield from _sync_pair()


def test_writes_that_reach_the_standby_before_it_is_promoted_are_retried(
    second_sync_pair: PgReplication,
) -> None:
    """A writer URL without ``target_session_attrs=read-write`` connects to the standby while the
    primary is dead: until it is promoted, its writes fail with SQLSTATE 25006 (a read-only
    transaction), which the driver retries like a lost connection instead of failing them."""
    figures = pg_failover.failover(
        second_sync_pair, threads=4, before=BEFORE, after=AFTER, promote_delay=1.0, attrs="any"
    )
    _assert_nothing_lost(figures)
