"""How the command prints an explanation (``reserve --dry-run``, and after a refusal): every
limit that stops the request, by how much, and the largest holders of what it counts, in each
resource's own units."""

from __future__ import annotations

import dataclasses
from typing import Any

from quota_ledger.model.quantity import format_human
from quota_ledger.model.values import Blocker, Explanation, Holder, Violation


def lines(explained: Explanation) -> list[str]:
    """The explanation as lines of text."""
    if explained.admitted:
        return ["would be admitted now"]
    count = len(explained.blockers)
    stop = f"{count} limit{'s' * (count != 1)} stop{'s' * (count == 1)} it"
    if explained.ahead is None:
        found = [f"would be refused: {stop}"]
    else:
        needs = ", ".join(f"{res}={format_human(res, n)}" for res, n in sorted(explained.ahead_needs.items()))
        ahead = f"{explained.ahead} request{'s' * (explained.ahead != 1)} ahead of it"
        why = stop if count else "it joins behind the requests that wait"
        found = [f"would wait in line: {why}; {ahead}" + (f", needing {needs}" if needs else "")]
    for blocker in explained.blockers:
        found += blocker_lines(blocker)
    return found


def blocker_lines(blocker: Blocker) -> list[str]:
    """One limit that stops a request, then its holders, indented."""
    violation = blocker.violation
    short = (
        "" if _hidden(violation) else f"; short by {format_human(violation.resource, violation.shortfall)}"
    )
    found = [f"  {describe(violation)}{short}"]
    if blocker.holders:
        found.append("    largest holders:")
        found += [f"      {holder_line(violation.resource, h)}" for h in blocker.holders]
    return found


def describe(violation: Violation) -> str:
    """A violation in one line; without its usage where the service hid it (a limit outside a
    restricted token's queue)."""
    if not _hidden(violation):
        return violation.describe()
    who = f" for {violation.kind} {violation.name}" if violation.name is not None else ""

    def human(units: int) -> str:
        return format_human(violation.resource, units)

    where = f"{violation.resource} at {violation.scope}{who}"
    return f"{where}: limit {human(violation.limit)}, requested {human(violation.requested)}"


def holder_line(resource: str, holder: Holder) -> str:
    """``application train in root.dev: 5Gi (in use 0, reserved 5Gi)``."""

    def human(units: int) -> str:
        return format_human(resource, units)

    who = (
        f"queue {holder.queue} (no user)"
        if holder.kind == "queue"
        else f"{holder.kind} {holder.name} in {holder.queue}"
    )
    return f"{who}: {human(holder.held)} (in use {human(holder.in_use)}, reserved {human(holder.reserved)})"


def after_refusal(blocker: Blocker) -> list[str]:
    """What follows a refusal's message for one limit (which the message has described): by how
    much, and who holds most of what it counts; nothing for a limit whose usage is hidden."""
    violation = blocker.violation
    if _hidden(violation):
        return []
    who = f" for {violation.kind} {violation.name}" if violation.name is not None else ""
    short = format_human(violation.resource, violation.shortfall)
    held = ", held most by:" if blocker.holders else ""
    found = [f"  {violation.resource} at {violation.scope}{who}, short by {short}{held}"]
    return found + [f"    {holder_line(violation.resource, h)}" for h in blocker.holders]


def as_dict(explained: Explanation) -> dict[str, Any]:
    """The explanation as JSON, in the service's shape (``POST /v1/reservations?dryRun=All``)."""
    return {
        "admitted": explained.admitted,
        "dry_run": True,
        "violations": [_violation(b.violation) for b in explained.blockers],
        "blockers": [
            {
                "violation": _violation(b.violation),
                "holders": [{**dataclasses.asdict(h), "held": h.held} for h in b.holders],
            }
            for b in explained.blockers
        ],
        "ahead": explained.ahead,
        "ahead_needs": explained.ahead_needs,
    }


def _violation(violation: Violation) -> dict[str, Any]:
    shortfall = None if _hidden(violation) else violation.shortfall
    return {**dataclasses.asdict(violation), "shortfall": shortfall}


def _hidden(violation: Violation) -> bool:
    """Whether the service hid the limit's usage (``None``: outside a restricted token's queue)."""
    in_use: int | None = violation.in_use
    return in_use is None or violation.reserved is None
