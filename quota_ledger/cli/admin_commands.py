"""The operator's commands: the schema (``db upgrade``, ``downgrade``, ``current``), upkeep
(``sweep``, ``audit``) and reports on who uses what (``users``, ``groups``, ``app-summary``).

alembic is imported by the ``db`` commands that run it, not with this module: every other
command starts without it."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from quota_ledger.cli import help_text, output, views
from quota_ledger.cli.exit_codes import EXIT_DRIFT, EXIT_ERROR, MEANINGS
from quota_ledger.runtime import location

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.runtime.settings import Settings


def register_schema(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``db`` and its actions; they work on the database, never through ``--url``."""
    common = options.common
    db = help_text.add_group(sub, "db", help="schema migrations")
    p = help_text.add_command(
        db,
        "upgrade",
        parents=[common],
        help="migrate to the newest schema (or --revision)",
        description="Create the schema, or migrate it to the newest revision (or --revision); "
        "a SQLite ledger that does not exist yet is created.",
        examples=[
            "quota-ledger db upgrade",
            "quota-ledger --db postgresql://ledger@db.example/quota db upgrade --revision 0012",
        ],
    )
    p.add_argument("--revision", default="head", metavar="REV", help="stop at this revision (default: head)")
    p.set_defaults(handler=_db_upgrade, local_only=True, creates_ledger=True)
    p = help_text.add_command(
        db,
        "downgrade",
        parents=[common],
        help="migrate down to REVISION (base = drop all)",
        examples=["quota-ledger db downgrade 0012", "quota-ledger db downgrade base  # drop every table"],
    )
    p.add_argument("revision", help="the revision to go down to (base: before the first, no tables)")
    p.set_defaults(handler=_db_downgrade, local_only=True)
    help_text.add_command(
        db,
        "current",
        parents=[common],
        help="print the schema revision",
        description="Print the revision the schema is at, and where the database is.",
        examples=["quota-ledger db current", "quota-ledger db current --json"],
    ).set_defaults(handler=_db_current, local_only=True)


def register_upkeep(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``sweep`` (on the database only) and ``audit``."""
    p = help_text.add_command(
        sub,
        "sweep",
        parents=[options.common],
        help="expire reservations whose time ran out",
        description="Expire reservations whose ttl ran out, every --interval seconds until SIGINT or "
        "SIGTERM (--once: a single sweep).",
        examples=[
            "quota-ledger sweep --once",
            "quota-ledger sweep --interval 10 --batch-size 1000 --workers 2 --max-rate 5000",
        ],
        exits={EXIT_ERROR: "error; or sweep --once left a reservation it could not expire (it names it)"},
    )
    p.add_argument("--once", action="store_true", help="one sweep, then exit")
    p.add_argument(
        "--interval", type=float, metavar="S", help="seconds between sweeps (env QUOTA_LEDGER_SWEEP_INTERVAL)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="reservations per transaction (env QUOTA_LEDGER_SWEEP_BATCH_SIZE)",
    )
    p.add_argument(
        "--workers", type=int, default=1, metavar="N", help="batches in flight at once, one thread each"
    )
    p.add_argument(
        "--max-rate",
        type=float,
        metavar="R",
        help="reservations per second at most, pausing between batches (env QUOTA_LEDGER_SWEEP_MAX_RATE)",
    )
    p.set_defaults(handler=_sweep, local_only=True)
    p = help_text.add_command(
        sub,
        "audit",
        parents=[options.common],
        help="check counters against the ledger history",
        description="Check every usage counter against the ledger history; --fix repairs those that "
        "disagree.",
        examples=["quota-ledger audit", "quota-ledger audit --partition default --fix"],
        exits={EXIT_DRIFT: MEANINGS[EXIT_DRIFT]},
    )
    p.add_argument("--fix", action="store_true", help="repair counters that disagree")
    p.add_argument(
        "--partition", default=None, metavar="P", help="audit this partition only (default: every one)"
    )
    p.set_defaults(handler=_audit)


def register_reports(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``users``, ``groups`` and ``app-summary``."""
    common, part = options.common, options.partition
    p = help_text.add_command(
        sub,
        "users",
        parents=[common, part],
        help="user usage and limits (all, or NAME)",
        description="Usage and limits of each user, per queue; --json prints YuniKorn's REST shape.",
        examples=["quota-ledger users", "quota-ledger users sue --json"],
    )
    p.add_argument("name", nargs="?", help="this user only (default: every user)")
    p.set_defaults(handler=_users)
    p = help_text.add_command(
        sub,
        "groups",
        parents=[common, part],
        help="group usage and limits (all, or NAME)",
        description="Usage and limits of each group, per queue; --json prints YuniKorn's REST shape.",
        examples=["quota-ledger groups", "quota-ledger groups dev --json"],
    )
    p.add_argument("name", nargs="?", help="this group only (default: every group)")
    p.set_defaults(handler=_groups)
    p = help_text.add_command(
        sub,
        "app-summary",
        parents=[common, part],
        help="usage summary of a finished application",
        description="The usage summary of the application's last finished run, as JSON: resource x "
        "seconds, its submission, start and finish times, its user and queue.",
        examples=["quota-ledger app-summary app-1", "quota-ledger app-summary app-1 --partition gpu"],
    )
    p.add_argument("application", help="the application's id, as given to reserve --application")
    p.set_defaults(handler=_app_summary)


# -- schema --------------------------------------------------------------------------------------
def _db_upgrade(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    engine.migrate(args.revision)
    return _db_current(engine, args, settings)


def _db_downgrade(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    from quota_ledger.driver import migrate

    with engine.driver.translated():
        migrate.downgrade(engine.driver.engine, args.revision)
    return _db_current(engine, args, settings)


def _db_current(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    from quota_ledger.driver import migrate

    with engine.driver.translated():
        revision = migrate.current(engine.driver.engine)
    where = {"revision": revision, "database": location.describe(settings.db)}
    output.say(args, where, "schema at {revision} in {database}")
    return 0


# -- upkeep --------------------------------------------------------------------------------------
def _sweep(engine: QuotaEngine, args: argparse.Namespace, settings: Settings) -> int:
    batch = args.batch_size or settings.sweep_batch_size
    rate = settings.sweep_max_rate if args.max_rate is None else args.max_rate
    from quota_ledger.ledger.batches import SetAside
    from quota_ledger.runtime import sweeper

    if args.once:
        set_aside = SetAside()
        expired = views.expire_backlog(engine, batch, args.workers, rate, set_aside)
        stuck = sorted(set_aside.reasons())
        if not stuck:
            output.say(args, {"expired": expired}, "expired {expired} reservations")
            return 0
        # Each is logged with its error; the rest expired. The exit code says some are left.
        found = {"expired": expired, "set_aside": stuck}
        output.say(args, found, "expired {expired} reservations; could not expire {set_aside}")
        return EXIT_ERROR
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    interval = args.interval or settings.sweep_interval
    pace = f", at most {rate:g}/s" if rate else ""
    print(f"sweeping every {interval}s in batches of {batch}{pace}; Ctrl-C to stop", file=sys.stderr)
    total = sweeper.run(
        engine,
        interval=interval,
        batch_size=batch,
        workers=args.workers,
        max_rate=rate,
        stop=stop,
        on_round=lambda n: print(f"expired {n} reservations", file=sys.stderr, flush=True) if n else None,
    )
    output.say(args, {"expired": total}, "stopped; expired {expired} reservations in total")
    return 0


def _audit(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    drifts = views.audit(engine, fix=args.fix, partition=args.partition)
    if args.json:
        output.emit([dataclasses.asdict(d) for d in drifts])
    elif not drifts:
        print("audit clean: every counter matches the ledger history")
    else:
        print(output.drift_table(drifts))
    return EXIT_DRIFT if drifts and not args.fix else 0


# -- reports -------------------------------------------------------------------------------------
def _users(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    if args.name:
        return _identities(args, "user", [engine.user_usage(args.name, partition=args.partition)])
    return _identities(args, "user", engine.user_usages(partition=args.partition))


def _groups(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    if args.name:
        return _identities(args, "group", [engine.group_usage(args.name, partition=args.partition)])
    return _identities(args, "group", engine.group_usages(partition=args.partition))


def _identities(args: argparse.Namespace, kind: str, found: list[dict[str, Any]]) -> int:
    if args.json:
        output.emit(found[0] if args.name else found)  # YuniKorn's REST shape
    else:
        print(output.identity_table(kind, found))
    return 0


def _app_summary(engine: QuotaEngine, args: argparse.Namespace, _s: Settings) -> int:
    output.emit(engine.application_summary(args.application, partition=args.partition))
    return 0
