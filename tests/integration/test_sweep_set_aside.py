"""A reservation whose expiry fails does not stop the sweep: its batch is bisected, it is set
aside (logged with its id) and skipped by later sweeps given the same memory, and every other
reservation expires.

The failing reservation is made for real: its queue's counter is lowered by hand below what it
reserved, so that taking its hold off would bring the counter under zero, which the database
refuses (``reserved >= 0``) on every backend and path.
"""

from __future__ import annotations

import logging
import time

import pytest
from sql_rows import execute
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine, ReservationState
from quota_ledger.ledger.batches import SetAside

SWEEPER = "quota_ledger.sweeper"


def make_backlog(ledger: QuotaEngine, url: URL) -> tuple[str, list[str]]:
    """One reservation that cannot be expired, the oldest to run out (so it is in the first
    batch), and five that can; their ids."""
    bad = ledger.reserve("root.bad", {"fpga": 5}, ttl=0.05)
    good = [ledger.reserve(f"root.ok{i % 2}", {"fpga": 1}, ttl=0.1).id for i in range(5)]
    execute(url, "UPDATE quota_usages SET reserved = 0 WHERE scope = 'root.bad'")
    time.sleep(0.2)
    return bad.id, good


def test_a_reservation_that_cannot_expire_is_set_aside_and_the_rest_expire(
    path_ledger: QuotaEngine, path_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    bad, good = make_backlog(path_ledger, path_url)
    set_aside = SetAside()
    with caplog.at_level(logging.WARNING, logger=SWEEPER):
        assert path_ledger.expire(batch_size=2, set_aside=set_aside) == 5
    assert {path_ledger.get(rid).state for rid in good} == {ReservationState.EXPIRED}
    assert path_ledger.get(bad).state is ReservationState.PENDING
    assert list(set_aside.reasons()) == [bad]
    (logged,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert bad in logged.getMessage()
    assert logged.exc_info is not None  # the error, with its cause
    assert path_ledger.usage("root")["fpga"].reserved == 0


def test_later_sweeps_skip_what_was_set_aside(
    path_ledger: QuotaEngine, path_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    bad, _ = make_backlog(path_ledger, path_url)
    set_aside = SetAside()
    assert path_ledger.expire(batch_size=2, set_aside=set_aside) == 5
    later = path_ledger.reserve("root.ok0", {"fpga": 1}, ttl=0.05)
    time.sleep(0.1)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=SWEEPER):
        assert path_ledger.expire(batch_size=2, set_aside=set_aside) == 1
    assert path_ledger.get(later.id).state is ReservationState.EXPIRED
    assert caplog.records == []  # nothing failed again: the reservation was not tried
    assert list(set_aside.reasons()) == [bad]


def test_a_sweep_without_a_memory_sets_aside_for_itself(path_ledger: QuotaEngine, path_url: URL) -> None:
    bad, _ = make_backlog(path_ledger, path_url)
    assert path_ledger.expire(batch_size=2) == 5
    assert path_ledger.expire(batch_size=2) == 0  # tried again, set aside again, not raised
    assert path_ledger.get(bad).state is ReservationState.PENDING
