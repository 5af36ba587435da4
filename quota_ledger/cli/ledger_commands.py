"""The ledger's own commands: ``reserve``, ``commit``, ``rollback``, ``show``, ``release``,
``usage`` and ``limits``. Each works the same on a database and through a service (``--url``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from quota_ledger.cli import explain_view, help_text, output, views
from quota_ledger.cli.arguments import resource_pairs
from quota_ledger.cli.exit_codes import EXIT_OVER_QUOTA, MEANINGS
from quota_ledger.model.errors import OverQuota

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.runtime.settings import Settings

#: ``RES=QTY`` arguments
RESOURCES_HELP = (
    "a resource and its quantity in Kubernetes notation: vcore=500m, memory=4Gi, nvidia.com/gpu=1"
)
#: ``ID`` arguments
ID_HELP = "the reservation's id, or a unique prefix of it (4 characters or more)"


def register(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``limits`` and the reservation commands, then ``usage``."""
    common, part, ident = options.common, options.partition, options.identity
    limits = help_text.add_group(sub, "limits", help="queue limits")
    p = help_text.add_command(
        limits,
        "set",
        parents=[common, part],
        help="set limits: QUEUE RES=QTY ... (RES=none removes)",
        description="Set limits of QUEUE, leaving its other resources' limits as they are; prints its "
        "limits.",
        examples=[
            "quota-ledger limits set root.prod memory=64Gi vcore=20 nvidia.com/gpu=4",
            "quota-ledger limits set root.prod nvidia.com/gpu=none  # remove one limit",
        ],
    )
    p.add_argument("queue", help="the queue, as a dotted path from root (root.prod)")
    p.add_argument(
        "resources", nargs="+", metavar="RES=QTY", help=f"{RESOURCES_HELP}; RES=none removes the limit"
    )
    p.set_defaults(handler=_limits_set)
    p = help_text.add_command(
        limits,
        "show",
        parents=[common, part],
        help="show limits",
        description="Show the limits of every queue of the partition, or of QUEUE.",
        examples=["quota-ledger limits show", "quota-ledger limits show root.prod --json"],
    )
    p.add_argument("queue", nargs="?", help="only this queue (default: every queue with a limit)")
    p.set_defaults(handler=_limits_show)

    over = {EXIT_OVER_QUOTA: MEANINGS[EXIT_OVER_QUOTA]}
    p = help_text.add_command(
        sub,
        "reserve",
        parents=[common, part, ident],
        help="reserve QUEUE RES=QTY ...",
        description="Reserve resources in QUEUE until they are committed, rolled back or expire; "
        "prints the reservation.",
        examples=[
            "quota-ledger reserve root.dev.team1 vcore=1 memory=2Gi --user sue --group dev",
            "quota-ledger reserve root.dev.team1 vcore=1 --ttl 60 --key job-42  # retried: reserved once",
            "quota-ledger reserve root.dev.team1 vcore=4 --wait 5m  # wait in line for capacity",
        ],
        exits=over,
    )
    p.add_argument("queue", help="the queue, as a dotted path from root (root.dev.team1)")
    p.add_argument("resources", nargs="*", metavar="RES=QTY", help=RESOURCES_HELP)
    p.add_argument(
        "--ttl",
        type=float,
        metavar="S",
        help="seconds until the reservation expires (default: QUOTA_LEDGER_DEFAULT_TTL, 300)",
    )
    p.add_argument(
        "--key", metavar="K", help="idempotency key (request id): a retry with it gets the same reservation"
    )
    p.add_argument("--priority-class", metavar="PC", help="the Kubernetes priority class it is for")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="write nothing: say whether the request would be admitted now, and what stops it",
    )
    p.add_argument(
        "--wait",
        type=_wait,
        metavar="DURATION",
        help="if it does not fit, wait in line for capacity this long (30s, 5m, 1h) instead of "
        "being refused; exit 3 if the wait runs out",
    )
    p.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="with --wait: its priority in line (higher is granted first; default 0)",
    )
    p.set_defaults(handler=_reserve)
    p = help_text.add_command(
        sub,
        "waiting",
        parents=[common, part],
        help="the requests waiting for capacity in QUEUE's subtree, in order",
        description="The requests waiting for capacity (reserve --wait) in QUEUE's subtree, or in the "
        "whole partition, in the order they are tried: priority, then arrival.",
        examples=["quota-ledger waiting root.dev", "quota-ledger waiting --json"],
    )
    p.add_argument("queue", nargs="?", help="the queue (default: the whole partition)")
    p.set_defaults(handler=_waiting)
    p = help_text.add_command(
        sub,
        "commit",
        parents=[common],
        help="commit ID or prefix [RES=QTY ... to commit less]",
        description="Commit a pending reservation: what it reserved becomes in use (or only RES=QTY of it).",
        examples=["quota-ledger commit 29ff", "quota-ledger commit 29ff1675 vcore=500m  # commit less"],
    )
    p.add_argument("id", help=ID_HELP)
    p.add_argument("resources", nargs="*", metavar="RES=QTY", help="commit this much instead of all of it")
    p.set_defaults(handler=_commit)
    p = help_text.add_command(
        sub,
        "rollback",
        parents=[common],
        help="roll back reservation ID (or a unique prefix of it)",
        examples=["quota-ledger rollback 29ff", "quota-ledger rollback 29ff1675-ddb5 --json"],
    )
    p.add_argument("id", help=ID_HELP)
    p.set_defaults(handler=_rollback)
    p = help_text.add_command(
        sub,
        "show",
        parents=[common],
        help="show reservation ID (or a unique prefix)",
        examples=["quota-ledger show 29ff", "quota-ledger show 29ff1675-ddb5-47e6-ade8-ded4a9fb99bf --json"],
    )
    p.add_argument("id", help=ID_HELP)
    p.set_defaults(handler=_show)
    p = help_text.add_command(
        sub,
        "release",
        parents=[common, part, ident],
        help="release QUEUE RES=QTY ...",
        description="Release resources in use in QUEUE (committed earlier): what a finished pod gives back.",
        examples=[
            "quota-ledger release root.dev.team1 vcore=1 memory=2Gi --user sue --group dev",
            "quota-ledger release root.dev.team1 vcore=1 --application app-1 --finished --key pod-7-done",
        ],
    )
    p.add_argument("queue", help="the queue, as a dotted path from root")
    p.add_argument("resources", nargs="+", metavar="RES=QTY", help=RESOURCES_HELP)
    p.add_argument(
        "--finished", action="store_true", help="the application has finished (app-summary reports it)"
    )
    p.add_argument("--key", metavar="K", help="idempotency key: the release happens once per key")
    p.set_defaults(handler=_release)
    p = help_text.add_command(
        sub,
        "usage",
        parents=[common, part],
        help="usage table of QUEUE's subtree; without QUEUE, the queue tree",
        description="In use, reserved, limit and available of QUEUE's whole subtree, per resource; "
        "without QUEUE, every queue as a tree.",
        examples=["quota-ledger usage", "quota-ledger usage root.prod --json"],
    )
    p.add_argument("queue", nargs="?", help="the queue (default: every queue, as a tree)")
    p.set_defaults(handler=_usage)


def _limits_set(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    made = engine.set_limits(
        args.queue, resource_pairs(args.resources, allow_none=True), partition=args.partition
    )
    for warning in made.warnings:  # on stderr: --json output stays one document
        print(f"warning: {warning}", file=sys.stderr)
    return _limits_show(engine, args, settings)


def _limits_show(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    limits = engine.limits(partition=args.partition)
    if getattr(args, "queue", None):
        limits = {q: v for q, v in limits.items() if q == args.queue}
    if args.json:
        output.emit(limits)
        return 0
    rows = [[q, res, output.human(res, lim), str(lim)] for q, v in limits.items() for res, lim in v.items()]
    print(output.table(["QUEUE", "RESOURCE", "LIMIT", "BASE UNITS"], rows) if rows else "no limits set")
    return 0


def _reserve(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    request: dict[str, Any] = {
        "partition": args.partition,
        "user": args.user,
        "groups": args.group or (),
        "application": args.application,
        "priority_class": args.priority_class,
        "ttl": args.ttl,
        "key": args.key,
    }
    if args.wait is not None:
        request["wait"] = args.wait
        request["priority"] = args.priority
    elif args.priority:
        print("error: --priority orders requests that wait: give --wait too", file=sys.stderr)
        return 2
    resources = resource_pairs(args.resources)
    if args.dry_run:
        explained = engine.explain(args.queue, resources, **request)
        if args.json:
            output.emit(explain_view.as_dict(explained))
        else:
            print("\n".join(explain_view.lines(explained)))
        return 0 if explained.admitted else EXIT_OVER_QUOTA
    try:
        made = engine.reserve(args.queue, resources, **request)
    except OverQuota as refused:
        if args.json:
            raise
        # Who holds the capacity, as it stands now (a second look: it may have changed).
        again = engine.explain(args.queue, resources, **request)
        print(f"error: {refused}", file=sys.stderr)
        for blocker in again.blockers:
            for line in explain_view.after_refusal(blocker):
                print(line, file=sys.stderr)
        return EXIT_OVER_QUOTA
    for warning in made.warnings:  # on stderr: --json output stays one document
        print(f"warning: {warning}", file=sys.stderr)
    return output.reservation(args, made)


def _waiting(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    line = engine.waiting(args.queue, partition=args.partition)
    if args.json:
        output.emit([dataclasses.asdict(r) for r in line])
        return 0
    if not line:
        print(f"nobody waits in {args.queue or 'partition ' + args.partition}")
        return 0
    rows = [
        [
            str(r.position),
            r.id[:8],
            str(r.priority),
            r.queue,
            output.amounts(r.resources),
            r.created_at.strftime("%H:%M:%S"),
            r.expires_at.strftime("%H:%M:%S"),
        ]
        for r in line
    ]
    print(output.table(["POS", "ID", "PRIORITY", "QUEUE", "NEEDS", "SINCE", "UNTIL"], rows))
    return 0


def _wait(text: str) -> float:
    """``--wait``: a malformed duration is bad usage (exit 2), said by argparse."""
    from quota_ledger.model import listing
    from quota_ledger.model.errors import InvalidRequest

    try:
        seconds = listing.duration(text, "--wait").total_seconds()
    except InvalidRequest as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("--wait must be longer than 0s")
    return seconds


def _commit(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    partial = resource_pairs(args.resources) if args.resources else None
    return output.reservation(args, engine.commit(views.full_id(engine, args.id), partial))


def _rollback(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    return output.reservation(args, engine.rollback(views.full_id(engine, args.id)))


def _show(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    return output.reservation(args, engine.get(views.full_id(engine, args.id)))


def _release(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    resources = resource_pairs(args.resources)
    engine.release(
        args.queue,
        resources,
        partition=args.partition,
        user=args.user,
        groups=args.group or (),
        application=args.application,
        finished=args.finished,
        key=args.key,
    )
    output.say(args, {"released": resources, "queue": args.queue}, "released from {queue}")
    return 0


def _usage(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    if args.queue is None:
        return _usage_tree(engine, args)
    usage = engine.usage(args.queue, partition=args.partition)
    if args.json:
        output.emit({res: {**dataclasses.asdict(u), "available": u.available} for res, u in usage.items()})
        return 0
    print(f"usage of {args.queue} (partition {args.partition}, whole subtree)")
    print(output.usage_table(usage) if usage else "no usage recorded")
    return 0


def _usage_tree(engine: QuotaEngine, args: argparse.Namespace) -> int:
    tree = views.queue_tree(engine, args.partition)
    if args.json:
        output.emit(
            {
                q: {res: {**dataclasses.asdict(u), "available": u.available} for res, u in usage.items()}
                for q, usage in tree.items()
            }
        )
        return 0
    print(f"queues of partition {args.partition} (usage of each whole subtree, the queue's own limit)")
    print(output.usage_tree(tree) if tree else "no usage or limits recorded")
    return 0
