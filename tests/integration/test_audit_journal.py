"""The audit checks the journal against the reservations it names, and its repair trusts the
reservations: a release that recorded nothing is found and mended, and a journal that holds
more than its reservations say never pulls the counters towards it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import create_engine, insert, update
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine, Usage
from quota_ledger.driver.dialect import normalize_url
from quota_ledger.driver.schema import quota_journal, reservations


def _write(db_url: URL, *statements: object) -> None:
    engine = create_engine(normalize_url(db_url))
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(statement)  # type: ignore[call-overload]
    finally:
        engine.dispose()


def test_a_release_that_released_nothing_is_found_and_mended(ledger: QuotaEngine, db_url: URL) -> None:
    # The damage a release racing a commit left: the reservation marked released, its committed
    # amounts still in use, and a journal (and counters) that agree with that.
    ledger.set_limits("root.q", {"fpga": 10})
    kept = ledger.commit(ledger.reserve("root.q", {"fpga": 2}).id)
    lost = ledger.commit(ledger.reserve("root.q", {"fpga": 3}).id)
    when = datetime.now(UTC).replace(tzinfo=None)
    _write(db_url, update(reservations).where(reservations.c.id == lost.id).values(released_at=when))
    assert ledger.usage("root.q")["fpga"].in_use == 5

    found = ledger.audit()
    assert [(d.scope_type, d.name, d.scope, d.resource, d.in_use, d.expected_in_use) for d in found] == [
        ("release", lost.id, "root.q", "fpga", 0, 3)
    ]
    fixed = ledger.audit(fix=True)
    assert {(d.scope_type, d.fixed) for d in fixed} == {("release", True), ("queue", True), ("subtree", True)}
    assert ledger.audit() == []
    assert ledger.usage("root.q")["fpga"] == Usage(in_use=2, reserved=0, limit=10)
    assert ledger.release_reservation(kept.id).released_at is not None
    assert ledger.usage("root.q")["fpga"].in_use == 0
    assert ledger.audit() == []


def test_a_commit_entry_of_a_rolled_back_reservation_is_reported_and_not_followed(
    ledger: QuotaEngine, db_url: URL
) -> None:
    ledger.set_limits("root.q", {"fpga": 10})
    gone = ledger.rollback(ledger.reserve("root.q", {"fpga": 4}).id)
    entry = {
        "partition": "default",
        "queue": "root.q",
        "resource": "fpga",
        "delta": 4,
        "kind": "commit",
        "reservation_id": gone.id,
        "operation_id": str(uuid.uuid4()),
        "created_at": datetime.now(UTC).replace(tzinfo=None),
    }
    _write(db_url, insert(quota_journal).values(**entry))

    found = {(d.scope_type, d.scope): d for d in ledger.audit()}
    assert (found[("commit", "root.q")].name, found[("commit", "root.q")].in_use) == (gone.id, 4)
    assert found[("commit", "root.q")].expected_in_use == 0
    assert found[("queue", "root.q")].expected_in_use == 4  # what the wrong journal says

    fixed = ledger.audit(fix=True)
    assert fixed
    assert not any(d.fixed for d in fixed)
    assert ledger.usage("root.q")["fpga"] == Usage(in_use=0, reserved=0, limit=10)


def test_a_partial_commit_then_release_is_consistent(ledger: QuotaEngine) -> None:
    ledger.set_limits("root.q", {"vcore": 10, "memory": "1Gi"})
    r = ledger.reserve("root.q", {"vcore": 4, "memory": "512Mi"})
    ledger.commit(r.id, {"vcore": 1})
    assert ledger.audit() == []
    ledger.release_reservation(r.id)
    assert ledger.audit() == []
    assert ledger.usage("root.q")["vcore"].in_use == 0
