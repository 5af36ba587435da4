"""Application tracking: per-application usage, the running state, and the usage summary.

Pure bookkeeping over one locked ``quota_applications`` row. An application runs from its first
reservation until ``release(..., finished=True)``, or until its last pending reservation is
rolled back or expires while nothing is in use. A user's reservations without an application
are kept in a per-(user, queue) bucket that is tracked the same way but never counts as a
running application and has no summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

RUNNING = "running"
FINISHED = "finished"
_BUCKET_MARK = "\t"


def app_key(application: str | None, user: str | None, queue: str) -> str:
    """The row key: the application id, or a per-(user, queue) bucket (TAB is never in names)."""
    if application is not None:
        return application
    return f"{_BUCKET_MARK}{user}{_BUCKET_MARK}{queue}"


@dataclass(slots=True)
class AppState:
    """One application's tracking row, as read under its row lock and then changed in place."""

    partition: str
    app_key: str
    application: str | None
    user: str | None
    queue: str
    group: str | None
    state: str
    pending: int
    submitted_at: datetime
    changed_at: datetime
    #: resource -> [in_use, reserved]
    usage: dict[str, list[int]] = field(default_factory=dict)
    #: resource -> in_use integrated over time, in base unit x microseconds
    area: dict[str, int] = field(default_factory=dict)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    id: int | None = None
    #: set by :func:`start`: this transaction made the application count as running
    started_now: bool = False

    @property
    def counts(self) -> bool:
        """Whether this row is a named application (buckets never count as running)."""
        return self.application is not None

    def in_use(self) -> dict[str, int]:
        return {res: v[0] for res, v in self.usage.items() if v[0]}

    def held(self) -> dict[str, tuple[int, int]]:
        return {res: (v[0], v[1]) for res, v in self.usage.items() if v[0] or v[1]}


def new_app(
    partition: str,
    application: str | None,
    user: str | None,
    queue: str,
    group: str | None,
    now: datetime,
) -> AppState:
    app = AppState(
        partition=partition,
        app_key=app_key(application, user, queue),
        application=application,
        user=user,
        queue=queue,
        group=group,
        state=RUNNING,
        pending=0,
        submitted_at=now,
        changed_at=now,
    )
    app.started_now = app.counts
    return app


def restart(app: AppState, group: str | None, now: datetime, *, user: str | None, queue: str) -> None:
    """A finished application is seen again: a new run, perhaps of another user or queue, with
    its group chosen again."""
    advance(app, now)
    app.user = user
    app.queue = queue
    app.state = RUNNING
    app.group = group
    app.area = {}
    app.submitted_at = now
    app.started_at = None
    app.finished_at = None
    app.started_now = app.counts


def advance(app: AppState, now: datetime) -> None:
    """Integrate in-use usage up to ``now`` (a clock that went backwards adds nothing)."""
    if now <= app.changed_at:
        return
    micros = (now - app.changed_at) // _MICROSECOND
    for resource, (in_use, _) in app.usage.items():
        if in_use:
            app.area[resource] = app.area.get(resource, 0) + in_use * micros
    app.changed_at = now


def add_reserved(app: AppState, amounts: Mapping[str, int]) -> None:
    for resource, amount in amounts.items():
        app.usage.setdefault(resource, [0, 0])[1] += amount
    app.pending += 1


def resolve(app: AppState, reserved: Mapping[str, int], committed: Mapping[str, int], now: datetime) -> None:
    """A pending reservation of this application was committed, rolled back or expired."""
    advance(app, now)
    for resource, amount in reserved.items():
        slot = app.usage.setdefault(resource, [0, 0])
        slot[1] = max(0, slot[1] - amount)
    for resource, amount in committed.items():
        if amount:
            app.usage.setdefault(resource, [0, 0])[0] += amount
            if app.started_at is None:
                app.started_at = now
    app.pending = max(0, app.pending - 1)
    _prune(app)


def shortfalls(app: AppState | None, amounts: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """resource -> (in_use, requested) for each resource the application holds too little of."""
    found = {}
    for resource, amount in amounts.items():
        have = app.usage.get(resource, [0, 0])[0] if app is not None else 0
        if have < amount:
            found[resource] = (have, amount)
    return found


def release(app: AppState, amounts: Mapping[str, int], now: datetime) -> None:
    advance(app, now)
    for resource, amount in amounts.items():
        app.usage[resource][0] -= amount
    _prune(app)


def idle(app: AppState) -> bool:
    """Running with nothing pending and nothing in use: its last reservation is gone."""
    return app.state == RUNNING and app.pending == 0 and not app.in_use()


def finish(app: AppState, now: datetime, state: str) -> dict[str, Any] | None:
    """Stop the application; returns its usage summary (None for a user's bucket)."""
    advance(app, now)
    was_running = app.state == RUNNING
    app.state = FINISHED
    app.finished_at = now
    if not app.counts or not was_running:
        return None
    return summary(app, state)


def summary(app: AppState, state: str) -> dict[str, Any]:
    """YuniKorn's ``YK_APP_SUMMARY`` fields; resource usage in base unit x seconds."""
    return {
        "appId": app.application,
        "partition": app.partition,
        "submissionTime": _millis(app.submitted_at),
        "startTime": _millis(app.started_at),
        "finishTime": _millis(app.finished_at),
        "user": app.user,
        "queue": app.queue,
        "state": state,
        "resourceUsage": {res: _round_div(area, 1_000_000) for res, area in sorted(app.area.items())},
    }


def _prune(app: AppState) -> None:
    for resource in [res for res, v in app.usage.items() if not v[0] and not v[1]]:
        del app.usage[resource]


def _round_div(value: int, divisor: int) -> int:
    return (2 * value + divisor) // (2 * divisor)


def _millis(value: datetime | None) -> int | None:
    if value is None:
        return None
    aware = value if value.tzinfo else value.replace(tzinfo=UTC)
    return (aware - _EPOCH) // _MILLISECOND


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_MILLISECOND = timedelta(milliseconds=1)
