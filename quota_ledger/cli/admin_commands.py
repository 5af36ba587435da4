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

from quota_ledger.cli import output, views
from quota_ledger.cli.exit_codes import EXIT_DRIFT, EXIT_ERROR
from quota_ledger.engine import QuotaEngine
from quota_ledger.ledger.batches import SetAside
from quota_ledger.service import location, sweeper
from quota_ledger.service.settings import Settings

if TYPE_CHECKING:
    from quota_ledger.cli.parser import SharedOptions, Subcommands


def register_schema(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``db`` and its actions; they work on the database, never through ``--url``."""
    common = options.common
    db = sub.add_parser("db", help="schema migrations").add_subparsers(title="db commands", metavar="ACTION")
    p = db.add_parser("upgrade", parents=[common], help="migrate to the newest schema (or --revision)")
    p.add_argument("--revision", default="head")
    p.set_defaults(handler=_db_upgrade, local_only=True, creates_ledger=True)
    p = db.add_parser("downgrade", parents=[common], help="migrate down to REVISION (base = drop all)")
    p.add_argument("revision")
    p.set_defaults(handler=_db_downgrade, local_only=True)
    db.add_parser("current", parents=[common], help="print the schema revision").set_defaults(
        handler=_db_current, local_only=True
    )


def register_upkeep(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``sweep`` (on the database only) and ``audit``."""
    p = sub.add_parser("sweep", parents=[options.common], help="expire reservations whose time ran out")
    p.add_argument("--once", action="store_true", help="one sweep, then exit")
    p.add_argument("--interval", type=float, help="seconds between sweeps (env QUOTA_LEDGER_SWEEP_INTERVAL)")
    p.add_argument("--batch-size", type=int, help="reservations per transaction")
    p.add_argument("--workers", type=int, default=1, help="batches in flight at once, one thread each")
    p.add_argument(
        "--max-rate",
        type=float,
        help="reservations per second at most, pausing between batches (env QUOTA_LEDGER_SWEEP_MAX_RATE)",
    )
    p.set_defaults(handler=_sweep, local_only=True)
    p = sub.add_parser("audit", parents=[options.common], help="check counters against the ledger history")
    p.add_argument("--fix", action="store_true", help="repair counters that disagree")
    p.add_argument("--partition", default=None)
    p.set_defaults(handler=_audit)


def register_reports(sub: Subcommands, options: SharedOptions) -> None:
    """Add ``users``, ``groups`` and ``app-summary``."""
    common, part = options.common, options.partition
    p = sub.add_parser("users", parents=[common, part], help="user usage and limits (all, or NAME)")
    p.add_argument("name", nargs="?")
    p.set_defaults(handler=_users)
    p = sub.add_parser("groups", parents=[common, part], help="group usage and limits (all, or NAME)")
    p.add_argument("name", nargs="?")
    p.set_defaults(handler=_groups)
    p = sub.add_parser("app-summary", parents=[common, part], help="usage summary of a finished application")
    p.add_argument("application")
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
