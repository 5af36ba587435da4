"""The usage history's arithmetic: walking back from the counters through each step's changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from quota_ledger import InvalidRequest
from quota_ledger.model.history import WINDOWS, rebuild, window_named

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def test_every_window_has_a_bounded_number_of_points() -> None:
    for name, window in WINDOWS.items():
        assert window.steps + 1 <= 97, name
        assert window_named(name) is window
    assert {w.span for w in WINDOWS.values()} == {
        timedelta(minutes=15),
        timedelta(hours=1),
        timedelta(hours=6),
        timedelta(days=1),
    }


@pytest.mark.parametrize("name", ["2h", "", "1H", "60m"])
def test_an_unknown_window_is_refused_with_the_valid_ones(name: str) -> None:
    with pytest.raises(InvalidRequest, match="15m, 1h, 6h, 1d") as refused:
        window_named(name)
    assert refused.value.field == "window"


def test_walking_back_undoes_each_step_in_turn() -> None:
    window = window_named("15m")  # 60 steps of 15 s
    found = rebuild(
        partition="default",
        queue="root.a",
        window=window,
        now=NOW,
        in_use={"vcore": 5000},
        reserved={"vcore": 1000, "memory": 2048},
        limits={"vcore": 8000},
        # step 10: 3 cores committed; step 50: 2 more; step 59: 1 core reserved
        in_use_changes={("vcore", 10): 3000, ("vcore", 50): 2000},
        reserved_changes={("vcore", 59): 1000, ("memory", 0): 2048},
    )
    assert found.start == NOW - timedelta(minutes=15)
    assert found.end == NOW
    assert [p.time for p in found.points][:2] == [found.start, found.start + timedelta(seconds=15)]
    used = [p.in_use["vcore"] for p in found.points]
    assert used[:11] == [0] * 11  # a change in step k shows from point k + 1 on
    assert used[11:51] == [3000] * 40
    assert used[51:] == [5000] * 10
    held = [p.reserved["vcore"] for p in found.points]
    assert held[:60] == [0] * 60
    assert held[60] == 1000
    assert [p.reserved["memory"] for p in found.points][:2] == [0, 2048]
    assert found.resources == ["memory", "vcore"]
    assert found.points[0].in_use["memory"] == 0


def test_the_last_point_is_the_counters_even_for_rows_stamped_after_now() -> None:
    window = window_named("1h")
    found = rebuild(
        partition="default",
        queue="root",
        window=window,
        now=NOW.replace(tzinfo=None),  # naive: the database's UTC clock
        in_use={"fpga": 4},
        reserved={},
        limits={},
        in_use_changes={("fpga", window.steps + 3): 4},
        reserved_changes={},
    )
    assert found.end.tzinfo is UTC
    assert found.points[-1].in_use == {"fpga": 4}
    assert found.points[-2].in_use == {"fpga": 0}


def test_usage_never_goes_below_zero() -> None:
    found = rebuild(
        partition="default",
        queue="root",
        window=window_named("15m"),
        now=NOW,
        in_use={"fpga": 1},
        reserved={},
        limits={},
        in_use_changes={("fpga", 30): 5},
        reserved_changes={},
    )
    assert min(p.in_use["fpga"] for p in found.points) == 0
