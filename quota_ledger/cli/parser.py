"""The ``quota-ledger`` argument parser: the options every command shares, and the command tree,
built from each command group's ``register``.

A command's parser carries, as defaults, its ``handler`` (called with the engine, the parsed
arguments and the settings; it returns the exit code) and two facts :mod:`quota_ledger.cli.app`
acts on before calling it: ``local_only`` (it needs the database, not a service ``--url``) and
``creates_ledger`` (it may create the database, so a missing SQLite file is not an error). A
command that works from its arguments alone sets ``standalone``: its handler is called with the
parsed arguments only, before any settings are read or any ledger is opened."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from quota_ledger.cli import (
    admin_commands,
    config_commands,
    kube_commands,
    ledger_commands,
    openstack_commands,
    reservation_commands,
    service_commands,
)
from quota_ledger.runtime import location

if TYPE_CHECKING:
    #: what ``add_subparsers`` returns: each group's ``register`` adds its commands to it
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

#: the global options, with their values when a command line does not give them
GLOBAL_DEFAULTS: dict[str, object] = {
    "db": None,
    "read_db": None,
    "json": False,
    "verbose": False,
    "settings": None,
    "url": None,
    "token": None,
    "token_file": None,
}


@dataclass(frozen=True, kw_only=True)
class SharedOptions:
    """Parent parsers that commands list in ``parents=[...]``."""

    #: the global options (``--db``, ``--json``, ``--url``...), accepted after the command too
    common: argparse.ArgumentParser
    #: ``--partition``
    partition: argparse.ArgumentParser
    #: ``--user``, ``--group``, ``--application``: who a reservation or release is for
    identity: argparse.ArgumentParser


def build() -> argparse.ArgumentParser:
    """The whole parser, commands in the order ``--help`` lists them."""
    options = shared_options()
    parser = argparse.ArgumentParser(
        prog="quota-ledger",
        description="A database-backed quota ledger: reserve, then commit or roll back.",
        epilog="`quota-ledger COMMAND --help` describes a command, with examples and its exit codes.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    add_global_options(parser, shown=True)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    admin_commands.register_schema(sub, options)
    ledger_commands.register(sub, options)
    reservation_commands.register(sub, options)
    admin_commands.register_upkeep(sub, options)
    config_commands.register(sub, options)
    admin_commands.register_reports(sub, options)
    kube_commands.register(sub, options)
    openstack_commands.register(sub, options)
    service_commands.register(sub, options)
    return parser


class _Version(argparse.Action):
    """``--version``: argparse's own version action wants the string when the parser is built, and
    reading the package's metadata then would slow every command down."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        import quota_ledger

        print(f"{parser.prog} {quota_ledger.__version__}")  # on stdout, as argparse's own prints it
        parser.exit()


def shared_options() -> SharedOptions:
    """The parents every command lists; the global options among them are hidden from a command's
    help, which points to ``quota-ledger --help`` instead of repeating them."""
    common = argparse.ArgumentParser(add_help=False)
    add_global_options(common, shown=False)
    partition = argparse.ArgumentParser(add_help=False)
    partition.add_argument(
        "--partition", default="default", metavar="P", help="the YuniKorn partition (default: default)"
    )
    identity = argparse.ArgumentParser(add_help=False)
    identity.add_argument("--user", metavar="U", help="the user it is for (checked against user limits)")
    identity.add_argument(
        "--group",
        action="append",
        metavar="G",
        help="a group of the user, checked against group limits (repeatable)",
    )
    identity.add_argument(
        "--application", metavar="A", help="the application it belongs to (for app-summary)"
    )
    return SharedOptions(common=common, partition=partition, identity=identity)


def add_global_options(parser: argparse.ArgumentParser, *, shown: bool) -> None:
    """Add the global options to ``parser``: with their help (``shown``, at the top), or hidden
    (under a command, where they are accepted too)."""
    # Global options take SUPPRESS as their default: a command's parser would otherwise set
    # the default over a value given before the command (the parents share their actions).
    # quota_ledger.cli.app fills in GLOBAL_DEFAULTS after parsing.
    group = parser.add_argument_group("global options (before or after the command)") if shown else parser

    def option(*names: str, text: str, **kwargs: Any) -> None:
        group.add_argument(
            *names, default=argparse.SUPPRESS, help=text if shown else argparse.SUPPRESS, **kwargs
        )

    option(
        "--db",
        metavar="URL",
        text="database URL, or several separated by spaces: the writer first, then the nodes to fail "
        f"over to (env QUOTA_LEDGER_DB; default: the SQLite file {location.default_file()})",
    )
    option(
        "--read-db",
        metavar="URL",
        text="replica URLs, separated by spaces, for reads that may lag (env QUOTA_LEDGER_READ_DB)",
    )
    option("--url", metavar="URL", text="talk to a running service instead (env QUOTA_LEDGER_URL)")
    option(
        "--token",
        metavar="TOKEN",
        text="bearer token for --url (env QUOTA_LEDGER_TOKEN); visible to other users in ps: "
        "prefer --token-file",
    )
    option(
        "--token-file",
        metavar="FILE",
        text="read the bearer token for --url from FILE (env QUOTA_LEDGER_TOKEN_FILE)",
    )
    option("--json", action="store_true", text="print JSON (errors too, on standard error)")
    option(
        "-v",
        "--verbose",
        action="store_true",
        text="log what happens, and a traceback of an unexpected error",
    )
    option(
        "--settings",
        metavar="FILE",
        text="settings file of QUOTA_LEDGER_*=value lines (env QUOTA_LEDGER_SETTINGS_FILE)",
    )
