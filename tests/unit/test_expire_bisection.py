"""How the sweep bisects a batch that fails, with the ledger's transactions stood in for (no
database): a batch of reservations stands for the ids it holds, and expiring one that is
marked bad raises as a statement the database refuses would."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import pytest

from quota_ledger.ledger import batches, expire
from quota_ledger.model.errors import DatabaseUnavailable, QuotaLedgerError

BACKLOG = [f"r{i}" for i in range(8)]


class Ledger:
    """Pending reservations (ids, oldest first); ``bad`` cannot be expired."""

    def __init__(self, bad: Collection[str], *, down: bool = False) -> None:
        self.pending = list(BACKLOG)
        self.bad = set(bad)
        self.down = down
        self.transactions = 0

    def run(self, work: Callable[[Any], int]) -> Any:
        self.transactions += 1
        if self.down:
            raise DatabaseUnavailable()
        return work(None)

    def expire(self, ids: Sequence[str]) -> int:
        if self.bad & set(ids):
            raise QuotaLedgerError("database error: IntegrityError")
        self.pending = [rid for rid in self.pending if rid not in ids]
        return len(ids)

    def batch(self, batch_size: int, skip: Collection[str]) -> list[str]:
        return [rid for rid in self.pending if rid not in skip][:batch_size]


@pytest.fixture
def standing_in(monkeypatch: pytest.MonkeyPatch) -> Callable[[Ledger], None]:
    """Have the sweep's transactions work on a :class:`Ledger`."""

    def use(ledger: Ledger) -> None:
        def general(tx: Any, rules: Any, partition: str, batch_size: int, skip: Collection[str] = ()) -> int:
            return ledger.expire(ledger.batch(batch_size, skip))

        def held(tx: Any, partition: str, batch_size: int, skip: Collection[str]) -> list[str]:
            return ledger.batch(batch_size, skip)

        def listed(tx: Any, rules: Any, partition: str, ids: Sequence[str]) -> int:
            return ledger.expire([rid for rid in ids if rid in ledger.pending])

        monkeypatch.setattr(expire, "general_batch", general)
        monkeypatch.setattr(expire, "expired_ids", held)
        monkeypatch.setattr(expire, "listed_batch", listed)

    return use


def sweep(ledger: Ledger, set_aside: batches.SetAside, batch_size: int = 8) -> int:
    one = lambda: expire.bisected_batch(ledger, None, "default", batch_size, set_aside)  # type: ignore[arg-type]  # noqa: E731
    return batches.run(one, batch_size, batches.Budget(None), set_aside=set_aside)


def test_a_failing_batch_is_bisected_down_to_the_reservation_that_fails(
    standing_in: Callable[[Ledger], None],
) -> None:
    ledger = Ledger(bad={"r5"})
    standing_in(ledger)
    set_aside = batches.SetAside()
    assert sweep(ledger, set_aside) == 7
    assert ledger.pending == ["r5"]
    assert set(set_aside.reasons()) == {"r5"}
    assert "IntegrityError" in set_aside.reasons()["r5"]
    # the batch, its ids read again, both halves of 4, of 2 and of 1, then a batch that finds
    # nothing left but what was set aside: 9 in all
    assert ledger.transactions == 9


def test_two_bad_reservations_are_both_set_aside(standing_in: Callable[[Ledger], None]) -> None:
    ledger = Ledger(bad={"r0", "r7"})
    standing_in(ledger)
    set_aside = batches.SetAside()
    assert sweep(ledger, set_aside) == 6
    assert set(set_aside.reasons()) == {"r0", "r7"}


def test_a_sweep_goes_on_past_a_batch_that_set_one_aside(standing_in: Callable[[Ledger], None]) -> None:
    ledger = Ledger(bad={"r0"})
    standing_in(ledger)
    set_aside = batches.SetAside()
    assert sweep(ledger, set_aside, batch_size=2) == 7  # the first batch is bisected, not the end
    assert ledger.pending == ["r0"]


def test_what_was_set_aside_is_skipped_from_then_on(standing_in: Callable[[Ledger], None]) -> None:
    ledger = Ledger(bad={"r3"})
    standing_in(ledger)
    set_aside = batches.SetAside()
    sweep(ledger, set_aside)
    ledger.pending += ["r8", "r9"]
    ledger.transactions = 0
    assert sweep(ledger, set_aside) == 2
    assert ledger.transactions == 1  # one batch, which did not meet r3


def test_an_outage_is_not_bisected(standing_in: Callable[[Ledger], None]) -> None:
    ledger = Ledger(bad={"r3"}, down=True)
    standing_in(ledger)
    set_aside = batches.SetAside()
    with pytest.raises(DatabaseUnavailable):
        sweep(ledger, set_aside)
    assert ledger.transactions == 1
    assert len(set_aside) == 0
