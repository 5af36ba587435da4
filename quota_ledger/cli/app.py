"""The ``quota-ledger`` command's entry point: it parses the command line, reads the settings,
opens the ledger (a database, or a service with ``--url``), runs the command and turns the
ledger's errors into messages and exit codes: 0 ok, 1 ledger error, 2 bad usage, 3 over quota,
4 audit found drift (without ``--fix``)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

from quota_ledger.cli import output, parser
from quota_ledger.cli.exit_codes import EXIT_DRIFT, EXIT_ERROR, EXIT_OVER_QUOTA, EXIT_USAGE
from quota_ledger.cli.remote import RemoteEngine
from quota_ledger.engine import QuotaEngine
from quota_ledger.model.errors import ConfigError, OverQuota, QuotaLedgerError
from quota_ledger.service import location
from quota_ledger.service.settings import Settings

__all__ = ["EXIT_DRIFT", "EXIT_ERROR", "EXIT_OVER_QUOTA", "EXIT_USAGE", "main"]

Handler = Callable[[QuotaEngine, argparse.Namespace, Settings], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    command_line = parser.build()
    args = command_line.parse_args(argv)
    for name, default in parser.GLOBAL_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    if not hasattr(args, "handler"):
        command_line.print_help()
        return EXIT_USAGE
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    logging.getLogger("quota_ledger.summary").setLevel(logging.INFO)  # a finished application's line
    settings_file = args.settings or os.environ.get("QUOTA_LEDGER_SETTINGS_FILE")
    given = {"db": args.db, "read_db": args.read_db}
    overrides: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    settings = Settings(_env_file=settings_file, **overrides)  # type: ignore[call-arg]
    url = args.url or os.environ.get("QUOTA_LEDGER_URL")
    if url and getattr(args, "local_only", False):
        print("error: this command works on the database (--db), not through --url", file=sys.stderr)
        return EXIT_USAGE
    try:
        engine = _open(args, settings, url)
    except QuotaLedgerError as error:
        output.fail(args, error)
        return EXIT_ERROR
    try:
        handler: Handler = args.handler
        return handler(engine, args, settings)
    except OverQuota as error:
        output.fail(args, error, violations=[dataclasses.asdict(v) for v in error.violations])
        return EXIT_OVER_QUOTA
    except ConfigError as error:
        if args.json:
            output.fail(args, error, problems=[dataclasses.asdict(p) for p in error.problems])
        else:  # each problem once: the list, not also the message that joins them
            count = len(error.problems)
            print(f"error: invalid configuration ({count} problem{'s' * (count != 1)}):", file=sys.stderr)
            for problem in error.problems:
                print(f"  - {problem.describe()}", file=sys.stderr)
        return EXIT_ERROR
    except QuotaLedgerError as error:
        output.fail(args, error)
        return EXIT_ERROR
    finally:
        engine.close()


def _open(args: argparse.Namespace, settings: Settings, url: str | None) -> QuotaEngine:
    if url:
        # The service client has the engine's methods and raises the engine's errors.
        return cast(QuotaEngine, RemoteEngine(url, args.token or os.environ.get("QUOTA_LEDGER_TOKEN")))
    if getattr(args, "creates_ledger", False):
        location.prepare(settings.db)
    else:
        location.require_existing(settings.db)  # else SQLite would leave an empty file behind
    # Someone waits at the terminal: a refused connection is a stopped server or a wrong URL,
    # said at once rather than after the 14 s a service spends riding out a failover.
    return QuotaEngine.from_url(settings.db_urls, **settings.engine_options(), retry_refused=False)
