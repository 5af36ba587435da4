"""What a listing of reservations asks for: its filters, checked in one place, and durations
such as ``10m`` or ``2h`` as the CLI and the service take them. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeGuard

from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.values import ReservationState

#: reservations a listing returns unless told otherwise
DEFAULT_LIMIT = 100
#: the most one listing returns
MAX_LIMIT = 1000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(?:(\d+)([smhd]))+", re.ASCII)
_PART = re.compile(r"(\d+)([smhd])", re.ASCII)


def duration(text: object, field: str = "older_than") -> timedelta:
    """``90s``, ``10m``, ``2h``, ``1d`` or ``1h30m`` (or a number of seconds) as a timedelta."""
    if isinstance(text, timedelta):
        seconds = text.total_seconds()
    elif _seconds(text):
        seconds = float(text)
    elif isinstance(text, str) and _DURATION.fullmatch(text):
        seconds = float(sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(text)))
    else:
        raise InvalidRequest(
            f"{field} must be a duration such as 90s, 10m, 2h, 1d or 1h30m, not {text!r}", field=field
        )
    if not 0 <= seconds <= 100 * 365 * 86400:
        raise InvalidRequest(f"{field} must be between 0 and 100 years", field=field)
    return timedelta(seconds=seconds)


def _seconds(text: object) -> TypeGuard[int | float | str]:
    """A plain number of seconds: a number, or text of digits only."""
    if isinstance(text, str):
        return text.isascii() and text.isdigit()
    return isinstance(text, int | float) and not isinstance(text, bool)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReservationQuery:
    """Which reservations of one partition a listing returns: oldest first, at most ``limit``."""

    partition: str = "default"
    #: the queue and every queue below it; None: every queue
    queue: str | None = None
    state: ReservationState | None = None
    user: str | None = None
    application: str | None = None
    #: made longer ago than this
    older_than: timedelta | None = None
    limit: int = DEFAULT_LIMIT


def query(
    *,
    partition: object = "default",
    queue: object = None,
    state: object = None,
    user: object = None,
    application: object = None,
    older_than: object = None,
    limit: object = DEFAULT_LIMIT,
) -> ReservationQuery:
    """A checked :class:`ReservationQuery` (``InvalidRequest`` naming the field otherwise)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be a whole number from 1 to {MAX_LIMIT}", field="limit")
    wanted: ReservationState | None = None
    if state is not None:
        try:
            wanted = ReservationState(str(state)) if isinstance(state, str) else None
        except ValueError:
            wanted = None
        if wanted is None:
            known = ", ".join(s.value for s in ReservationState)
            raise InvalidRequest(f"state must be one of {known}, not {state!r}", field="state")
    return ReservationQuery(
        partition=validation.partition(partition),
        queue=None if queue is None else validation.queue(queue),
        state=wanted,
        user=validation.optional_name(user, "user"),
        application=validation.optional_name(application, "application"),
        older_than=None if older_than is None else duration(older_than),
        limit=limit,
    )
