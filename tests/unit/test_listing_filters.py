"""The filters of a reservation listing and the durations ``--older-than`` takes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from quota_ledger.model import listing
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.values import ReservationState


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("45", 45), (30, 30)],
)
def test_durations_read_as_people_write_them(text: object, seconds: int) -> None:
    assert listing.duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "m", "10x", "1.5h", "-5m", "ten", True, -1, float("nan")])
def test_what_is_no_duration_is_refused_naming_the_field(text: object) -> None:
    with pytest.raises(InvalidRequest) as caught:
        listing.duration(text)
    assert caught.value.field == "older_than"


def test_a_query_is_checked_and_holds_typed_values() -> None:
    wanted = listing.query(queue="root.a", state="pending", older_than="10m", limit=5)
    assert wanted.state is ReservationState.PENDING
    assert wanted.older_than == timedelta(minutes=10)
    assert (wanted.queue, wanted.limit, wanted.partition) == ("root.a", 5, "default")
    assert listing.query().limit == listing.DEFAULT_LIMIT
    with pytest.raises(InvalidRequest, match="state must be one of pending, waiting, committed"):
        listing.query(state="PENDING ")
    with pytest.raises(InvalidRequest):
        listing.query(limit=True)
