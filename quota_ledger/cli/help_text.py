"""What a command's ``--help`` shows beyond its arguments: two or more examples, its exit codes and
a pointer to the global options, which ``quota-ledger --help`` lists once.

Every command is added with :func:`add_command` (a group of actions, such as ``config``, with
:func:`add_group`)::

    p = add_command(
        sub,
        "usage",
        help="usage table of QUEUE's subtree",
        parents=[options.common, options.partition],
        examples=["quota-ledger usage root.team-a", "quota-ledger usage --json"],
    )
    p.add_argument("queue", nargs="?", help="...")  # every argument gets help text

The exit codes 0, 1 and 2 are listed for every command; ``exits`` adds the others a command may
return (``{EXIT_OVER_QUOTA: ...}``) or says what 1 means for it. This module imports argparse and
nothing else, so building the parser stays cheap.

Descriptions are wrapped (paragraphs apart by a blank line); the examples are shown as written,
so each should fit in 100 columns."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from quota_ledger.cli import exit_codes

if TYPE_CHECKING:
    from quota_ledger.cli.parser import Subcommands

#: the last line of every command's help: the global options are described once, at the top
GLOBAL_OPTIONS_NOTE = (
    "global options (--db, --url, --token, --token-file, --json, -v, ...): see quota-ledger --help"
)


def add_command(
    sub: Subcommands,
    name: str,
    *,
    help: str,
    examples: Sequence[str],
    parents: Sequence[argparse.ArgumentParser] = (),
    exits: Mapping[int, str] | None = None,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """Add command ``name`` to ``sub``: ``help`` is its line in the parent's list (and, without a
    ``description``, the first line of its own help); ``examples`` are whole command lines, each
    with an optional ``  # why`` after it."""
    return sub.add_parser(
        name,
        parents=list(parents),
        help=help,
        description=_paragraphs(description or _sentence(help)),
        epilog=epilog(examples, exits),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_group(sub: Subcommands, name: str, *, help: str) -> Subcommands:
    """Add command group ``name`` (``config``, ``tokens``...) and return the place for its actions,
    each added with :func:`add_command`."""
    group = sub.add_parser(
        name,
        help=help,
        description=_paragraphs(
            f"{_sentence(help)} `quota-ledger {name} ACTION --help` describes an action."
        ),
        epilog=GLOBAL_OPTIONS_NOTE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return group.add_subparsers(title=f"{name} actions", metavar="ACTION")


def epilog(examples: Sequence[str], exits: Mapping[int, str] | None = None) -> str:
    """The text below a command's arguments: its examples, its exit codes and the note on the
    global options."""
    if len(examples) < 2:
        raise ValueError("a command's help gives at least two examples")
    codes = {**exit_codes.MEANINGS_SHARED, **(exits or {})}
    lines = ["examples:", *(f"  {example}" for example in examples)]
    lines += ["", "exit codes:"]
    lines += [f"  {code}  {meaning}" for code, meaning in sorted(codes.items())]
    lines += ["", GLOBAL_OPTIONS_NOTE]
    return "\n".join(lines)


def _paragraphs(text: str) -> str:
    """``text`` wrapped as argparse wraps help (the raw formatter of the examples does not)."""
    return "\n\n".join(textwrap.fill(paragraph, width=78) for paragraph in text.split("\n\n"))


def _sentence(text: str) -> str:
    text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else f"{text}."
