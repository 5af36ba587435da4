"""The ``quota-ledger`` command's entry point: it parses the command line, reads the settings,
opens the ledger (a database, or a service with ``--url``), runs the command and turns the
ledger's errors into messages and exit codes: 0 ok, 1 ledger error, 2 bad usage, 3 over quota,
4 audit found drift (without ``--fix``).

No message shows a password or a token: a database URL is shown with ``***`` for its password,
and every error message, the unexpected ones too, is scrubbed of the secrets the command was
given. The ledger's modules (SQLAlchemy, pydantic...) are imported once the command line is read,
so ``--help`` and a mistyped option answer at once."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from quota_ledger.cli import credentials, parser
from quota_ledger.cli.exit_codes import EXIT_DRIFT, EXIT_ERROR, EXIT_OVER_QUOTA, EXIT_USAGE
from quota_ledger.model import url_text

if TYPE_CHECKING:
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.runtime.settings import Settings

__all__ = ["EXIT_DRIFT", "EXIT_ERROR", "EXIT_OVER_QUOTA", "EXIT_USAGE", "console_main", "main"]

Handler = Callable[["QuotaEngine", argparse.Namespace, "Settings"], int]

#: the settings that hold database URLs, whose passwords no message shows
_URL_VARIABLES = ("QUOTA_LEDGER_DB", "QUOTA_LEDGER_READ_DB", "QUOTA_LEDGER_URL")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    command_line = parser.build()
    args = command_line.parse_args(argv)
    for name, default in parser.GLOBAL_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    if getattr(args, "standalone", False):  # it works from its arguments alone: no settings, no ledger
        standalone: Callable[[argparse.Namespace], int] = args.handler
        return standalone(args)
    if not hasattr(args, "handler"):
        command_line.print_help()
        return EXIT_USAGE
    given = [args.db, args.read_db, args.url, *(os.environ.get(name) for name in _URL_VARIABLES)]
    secrets = url_text.passwords(given)
    collecting = gc.isenabled()
    # Opening the ledger imports SQLAlchemy, pydantic and the engine: a great many objects that
    # live as long as the process, which the cyclic collector would walk again and again while
    # they load (a tenth of the start-up). It runs again before the command does, with those
    # objects frozen (gc.freeze): its first collection would otherwise walk them all at once.
    # They are unfrozen when the command is done (a caller's own frozen objects are left alone).
    freezing = collecting and gc.get_freeze_count() == 0
    gc.disable()
    try:
        return _run(args, secrets, collect=collecting, freeze=freezing)
    except Exception as error:  # the last resort: a message, never a traceback with a secret
        _unexpected(args, error, secrets)
        return EXIT_ERROR
    finally:
        if freezing:
            gc.unfreeze()
        if collecting:
            gc.enable()


def console_main() -> int:
    """The ``quota-ledger`` program (and ``python -m quota_ledger.cli``): :func:`main` on this
    process's arguments. What is left is then frozen for the process's exit, whose collections
    would otherwise walk every object of the ledger's modules once more (a tenth of a command)."""
    code = main()
    gc.freeze()
    return code


def _run(args: argparse.Namespace, secrets: set[str], *, collect: bool, freeze: bool) -> int:
    import dataclasses
    import logging

    from quota_ledger.cli import output
    from quota_ledger.model.errors import ConfigError, OverQuota, QuotaLedgerError
    from quota_ledger.runtime.settings import Settings

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    logging.getLogger("quota_ledger.summary").setLevel(logging.INFO)  # a finished application's line
    settings_file = args.settings or os.environ.get("QUOTA_LEDGER_SETTINGS_FILE")
    given = {"db": args.db, "read_db": args.read_db}
    overrides: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    settings = Settings(_env_file=settings_file, **overrides)  # type: ignore[call-arg]
    secrets |= url_text.passwords([settings.db, settings.read_db])  # a settings file's too
    url = args.url or os.environ.get("QUOTA_LEDGER_URL")
    if url and getattr(args, "local_only", False):
        print("error: this command works on the database (--db), not through --url", file=sys.stderr)
        return EXIT_USAGE
    try:
        token = credentials.bearer_token(args.token, args.token_file) if url else None
    except credentials.TokenUnavailable as error:
        output.fail(args, error, secrets=secrets)
        return EXIT_USAGE
    if token is not None:
        secrets.add(token.value)
    try:
        engine = _open(args, settings, url, token)
    except QuotaLedgerError as error:
        output.fail(args, error, secrets=secrets)
        return EXIT_ERROR
    if collect:
        if freeze:
            gc.freeze()
        gc.enable()
    try:
        handler: Handler = args.handler
        return handler(engine, args, settings)
    except OverQuota as error:
        violations = [dataclasses.asdict(v) for v in error.violations]
        output.fail(args, error, secrets=secrets, violations=violations)
        return EXIT_OVER_QUOTA
    except ConfigError as error:
        if args.json:
            problems = [dataclasses.asdict(p) for p in error.problems]
            output.fail(args, error, secrets=secrets, problems=problems)
        else:  # each problem once: the list, not also the message that joins them
            count = len(error.problems)
            print(f"error: invalid configuration ({count} problem{'s' * (count != 1)}):", file=sys.stderr)
            for problem in error.problems:
                print(f"  - {problem.describe()}", file=sys.stderr)
        return EXIT_ERROR
    except QuotaLedgerError as error:
        output.fail(args, error, secrets=secrets)
        return EXIT_ERROR
    finally:
        engine.close()


def _open(
    args: argparse.Namespace, settings: Settings, url: str | None, token: credentials.BearerToken | None
) -> QuotaEngine:
    from quota_ledger.engine import QuotaEngine
    from quota_ledger.runtime import location

    if url:
        from quota_ledger.cli.remote import RemoteEngine

        # The service client has the engine's methods and raises the engine's errors.
        if token is None:
            return cast(QuotaEngine, RemoteEngine(url, None))
        return cast(QuotaEngine, RemoteEngine(url, token.value, token_source=token.source))
    if getattr(args, "creates_ledger", False):
        location.prepare(settings.db)
    else:
        location.require_existing(settings.db)  # else SQLite would leave an empty file behind
    # Someone waits at the terminal: a refused connection is a stopped server or a wrong URL,
    # said at once rather than after the 14 s a service spends riding out a failover.
    return QuotaEngine.from_url(settings.db_urls, **settings.engine_options(), retry_refused=False)


def _unexpected(args: argparse.Namespace, error: Exception, secrets: set[str]) -> None:
    """Report an error the ledger did not foresee: its type and message (and with -v its
    traceback), each scrubbed of the command's secrets."""
    import json
    import traceback

    message = url_text.scrub(str(error), secrets)
    if getattr(args, "verbose", False):
        trace = "".join(traceback.format_exception(error))
        print(url_text.scrub(trace, secrets), file=sys.stderr, end="")
    if getattr(args, "json", False):
        report = {"error": type(error).__name__, "message": message}
        print(json.dumps(report, indent=2), file=sys.stderr)
    else:
        hint = "" if getattr(args, "verbose", False) else " (-v shows where)"
        print(f"error: {type(error).__name__}: {message}{hint}", file=sys.stderr)
