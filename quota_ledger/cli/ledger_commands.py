"""The ledger's own commands: ``reserve``, ``commit``, ``rollback``, ``show``, ``release``,
``usage`` and ``limits``. Each works the same on a database and through a service (``--url``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING

from quota_ledger.cli import output, views
from quota_ledger.cli.arguments import resource_pairs
from quota_ledger.engine import QuotaEngine
from quota_ledger.service.settings import Settings

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands


def register(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``limits`` and the reservation commands, then ``usage``."""
    common, part, ident = options.common, options.partition, options.identity
    limits = sub.add_parser("limits", help="queue limits").add_subparsers(
        title="limits commands", metavar="ACTION"
    )
    p = limits.add_parser(
        "set", parents=[common, part], help="set limits: QUEUE RES=QTY ... (RES=none removes)"
    )
    p.add_argument("queue")
    p.add_argument("resources", nargs="+", metavar="RES=QTY")
    p.set_defaults(handler=_limits_set)
    p = limits.add_parser("show", parents=[common, part], help="show limits")
    p.add_argument("queue", nargs="?")
    p.set_defaults(handler=_limits_show)

    p = sub.add_parser("reserve", parents=[common, part, ident], help="reserve QUEUE RES=QTY ...")
    p.add_argument("queue")
    p.add_argument("resources", nargs="*", metavar="RES=QTY")
    p.add_argument("--ttl", type=float, help="seconds until the reservation expires")
    p.add_argument("--key", help="idempotency key (request id)")
    p.add_argument("--priority-class")
    p.set_defaults(handler=_reserve)
    p = sub.add_parser("commit", parents=[common], help="commit ID or prefix [RES=QTY ... to commit less]")
    p.add_argument("id")
    p.add_argument("resources", nargs="*", metavar="RES=QTY")
    p.set_defaults(handler=_commit)
    p = sub.add_parser(
        "rollback", parents=[common], help="roll back reservation ID (or a unique prefix of it)"
    )
    p.add_argument("id")
    p.set_defaults(handler=_rollback)
    p = sub.add_parser("show", parents=[common], help="show reservation ID (or a unique prefix)")
    p.add_argument("id")
    p.set_defaults(handler=_show)
    p = sub.add_parser("release", parents=[common, part, ident], help="release QUEUE RES=QTY ...")
    p.add_argument("queue")
    p.add_argument("resources", nargs="+", metavar="RES=QTY")
    p.add_argument("--finished", action="store_true", help="the application has finished")
    p.add_argument("--key", help="idempotency key: the release happens once per key")
    p.set_defaults(handler=_release)
    p = sub.add_parser(
        "usage", parents=[common, part], help="usage table of QUEUE's subtree; without QUEUE, the queue tree"
    )
    p.add_argument("queue", nargs="?")
    p.set_defaults(handler=_usage)


def _limits_set(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    engine.set_limits(args.queue, resource_pairs(args.resources, allow_none=True), partition=args.partition)
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
    made = engine.reserve(
        args.queue,
        resource_pairs(args.resources),
        partition=args.partition,
        user=args.user,
        groups=args.group or (),
        application=args.application,
        priority_class=args.priority_class,
        ttl=args.ttl,
        key=args.key,
    )
    for warning in made.warnings:  # on stderr: --json output stays one document
        print(f"warning: {warning}", file=sys.stderr)
    return output.reservation(args, made)


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
