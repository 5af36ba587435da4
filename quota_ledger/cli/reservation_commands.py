"""``reservations`` (a filtered listing) and ``prune`` (the counters at zero nothing references).
Each works the same on a database and through a service (``--url``)."""

from __future__ import annotations

import argparse
import dataclasses
from datetime import timedelta
from typing import TYPE_CHECKING

from quota_ledger.cli import help_text, output

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.model.values import IdleCounter, Reservation
    from quota_ledger.runtime.settings import Settings

#: rows ``reservations`` prints unless ``--limit`` says otherwise
DEFAULT_LIMIT = 50
_STATES = ("pending", "committed", "rolled_back", "expired")


def register(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``reservations`` and ``prune``."""
    p = help_text.add_command(
        sub,
        "reservations",
        parents=[options.common, options.partition],
        help="list reservations by queue, state, user, application or age",
        description="List the partition's reservations, oldest first: those of a queue and its "
        "subtree, in a state, of a user or an application, made longer ago than a duration. A "
        "token restricted to a subtree (--url) lists only that subtree.",
        examples=[
            "quota-ledger reservations --queue root.dev --state pending --older-than 2h",
            "quota-ledger reservations --user sue --json  # scripts read base units",
        ],
    )
    p.add_argument("--queue", metavar="Q", help="this queue and every queue below it")
    p.add_argument("--state", choices=_STATES, help="only reservations in this state")
    p.add_argument("--user", metavar="U", help="only the reservations of this user")
    p.add_argument("--application", metavar="A", help="only the reservations of this application")
    p.add_argument(
        "--older-than",
        metavar="D",
        type=_duration,
        help="only those made longer ago than D: 90s, 10m, 2h, 1d, 1h30m",
    )
    p.add_argument(
        "--limit",
        metavar="N",
        type=_limit,
        default=DEFAULT_LIMIT,
        help=f"print at most N, the oldest (default {DEFAULT_LIMIT}, at most 999)",
    )
    p.set_defaults(handler=_reservations)

    p = help_text.add_command(
        sub,
        "prune",
        parents=[options.common],
        help="list, or with --apply delete, counters at zero that nothing references",
        description="List the usage counters at zero that no limit, configuration or reservation "
        "references (a typo's resource or queue, a departed user's copy of a limit); --apply "
        "deletes them, all or nothing, while no reservation runs in their partition. A later "
        "reservation creates again what it needs.",
        examples=["quota-ledger prune  # a dry run", "quota-ledger prune --apply --partition default"],
    )
    p.add_argument("--apply", action="store_true", help="delete them (default: only list them)")
    p.add_argument("--partition", metavar="P", help="only this partition (default: every partition)")
    p.set_defaults(handler=_prune)


def _duration(text: str) -> timedelta:
    """``--older-than``: a malformed duration is bad usage (exit 2), said by argparse."""
    from quota_ledger.model import listing
    from quota_ledger.model.errors import InvalidRequest

    try:
        return listing.duration(text, "--older-than")
    except InvalidRequest as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 999:
        raise argparse.ArgumentTypeError(f"--limit must be a whole number from 1 to 999, not {text!r}")
    return value


def _reservations(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    found = engine.list_reservations(
        partition=args.partition,
        queue=args.queue,
        state=args.state,
        user=args.user,
        application=args.application,
        older_than=args.older_than,
        limit=args.limit + 1,  # one more tells whether more match
    )
    shown, more = found[: args.limit], len(found) > args.limit
    if args.json:
        output.emit({"reservations": [dataclasses.asdict(r) for r in shown], "more": more})
        return 0
    if not shown:
        print("no reservations match")
        return 0
    print(_table(shown))
    if more:
        print(f"the oldest {len(shown)} shown; more match (--limit N, or narrow the filters)")
    return 0


def _table(found: list[Reservation]) -> str:
    rows = [
        [
            r.id,
            r.state.value,
            r.queue,
            r.user or "-",
            r.application or "-",
            r.created_at.isoformat(timespec="seconds"),
            output.amounts(r.resources),
        ]
        for r in found
    ]
    return output.table(["ID", "STATE", "QUEUE", "USER", "APPLICATION", "CREATED", "RESOURCES"], rows)


def _prune(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    found = engine.prune(apply=args.apply, partition=args.partition)
    if args.json:
        output.emit({"applied": args.apply, "counters": [dataclasses.asdict(c) for c in found]})
        return 0
    if not found:
        print("nothing to prune: every counter at zero is referenced")
        return 0
    print(_prune_table(found))
    count = f"{len(found)} counter{'s' * (len(found) != 1)}"
    print(f"pruned {count}" if args.apply else f"would prune {count} (a dry run: --apply deletes them)")
    return 0


def _prune_table(found: list[IdleCounter]) -> str:
    rows = [[c.partition, c.kind, c.queue, c.name or "-", c.resource] for c in found]
    return output.table(["PARTITION", "KIND", "QUEUE", "NAME", "RESOURCE"], rows)
