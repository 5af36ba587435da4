"""Usage over time, rebuilt from the ledger's counters and its changes: pure arithmetic, no I/O.

A window (``1h``, ``1d``, ...) is cut into equal steps ending now. The counters give the usage
now; the driver sums each step's changes (journal deltas for in-use, reservations made minus
resolved for reserved). Walking back from now, the usage at the start of a step is the usage at
its end minus the step's changes. Points are samples at the step boundaries, so a peak shorter
than a step may fall between two of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from quota_ledger.model.errors import InvalidRequest


@dataclass(frozen=True, kw_only=True, slots=True)
class Window:
    """A span of history and the step between its points."""

    name: str
    #: seconds between two points
    step: int
    #: number of steps; the history has ``steps + 1`` points
    steps: int

    @property
    def span(self) -> timedelta:
        return timedelta(seconds=self.step * self.steps)


#: The windows one may ask for. At most 97 points each, whatever the ledger's load.
WINDOWS: dict[str, Window] = {
    w.name: w
    for w in (
        Window(name="15m", step=15, steps=60),
        Window(name="1h", step=60, steps=60),
        Window(name="6h", step=300, steps=72),
        Window(name="1d", step=900, steps=96),
    )
}


def window_named(name: str) -> Window:
    """The window called ``name``; ``InvalidRequest`` naming the valid ones otherwise."""
    found = WINDOWS.get(name) if isinstance(name, str) else None
    if found is None:
        raise InvalidRequest(f"unknown window {name!r}: use one of {', '.join(WINDOWS)}", field="window")
    return found


@dataclass(frozen=True, kw_only=True, slots=True)
class HistoryPoint:
    """A queue subtree's usage at one instant, per resource, in base units."""

    time: datetime
    in_use: dict[str, int]
    reserved: dict[str, int]


@dataclass(frozen=True, kw_only=True, slots=True)
class UsageHistory:
    """In-use and reserved usage of a queue's whole subtree over a window, oldest point first."""

    partition: str
    queue: str
    window: Window
    start: datetime
    end: datetime
    #: the queue's own limits now (limits in force earlier are not replayed)
    limits: dict[str, int]
    points: tuple[HistoryPoint, ...]

    @property
    def resources(self) -> list[str]:
        """Every resource limited, used or reserved in the window, sorted."""
        return sorted(self.points[0].in_use) if self.points else sorted(self.limits)


def rebuild(
    *,
    partition: str,
    queue: str,
    window: Window,
    now: datetime,
    in_use: Mapping[str, int],
    reserved: Mapping[str, int],
    limits: Mapping[str, int],
    in_use_changes: Mapping[tuple[str, int], int],
    reserved_changes: Mapping[tuple[str, int], int],
) -> UsageHistory:
    """The history from the usage ``now`` and each step's changes ``{(resource, step): delta}``.

    Step ``k`` holds the changes made in ``[start + k*step, start + (k+1)*step)``. A change
    stamped at or after ``now`` (rows committed while the counters were read) counts in the
    last step, so the last point is the usage ``now`` exactly.
    """
    now = now.replace(tzinfo=UTC) if now.tzinfo is None else now.astimezone(UTC)
    start = now - window.span
    changed = {resource for resource, _ in [*in_use_changes, *reserved_changes]}
    resources = sorted(set(limits) | set(in_use) | set(reserved) | changed)
    used = _walk_back(window.steps, resources, in_use, in_use_changes)
    held = _walk_back(window.steps, resources, reserved, reserved_changes)
    points = tuple(
        HistoryPoint(
            time=start + timedelta(seconds=k * window.step),
            in_use={r: used[r][k] for r in resources},
            reserved={r: held[r][k] for r in resources},
        )
        for k in range(window.steps + 1)
    )
    return UsageHistory(
        partition=partition,
        queue=queue,
        window=window,
        start=start,
        end=now,
        limits=dict(sorted(limits.items())),
        points=points,
    )


def _walk_back(
    steps: int, resources: list[str], now: Mapping[str, int], changes: Mapping[tuple[str, int], int]
) -> dict[str, list[int]]:
    per_step: dict[str, list[int]] = {r: [0] * steps for r in resources}
    for (resource, step), delta in changes.items():
        if step >= 0:  # the statements read from the window's start on; a guard all the same
            per_step[resource][min(step, steps - 1)] += delta
    values: dict[str, list[int]] = {}
    for resource in resources:
        series = [0] * (steps + 1)
        value = now.get(resource, 0)
        series[steps] = value
        for k in range(steps - 1, -1, -1):
            value -= per_step[resource][k]
            # Never below zero: a counter cannot be, and a row stamped by a clock that went
            # back would otherwise show as negative usage.
            series[k] = max(0, value)
        values[resource] = series
    return values
