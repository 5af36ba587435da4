"""docs/cli-reference.md lists every command and option of the ``quota-ledger`` parser, and no other.

The synopsis block under "## Commands" is read as the parser is built: its first line holds the
global options, and every other command is a run of words that names a command of the parser
(``db upgrade``, ``tokens add``) followed by its options, up to the next command. Remarks in
parentheses are skipped. A command or option the parser has and the block lacks fails, as does a
word of the block that is neither a command, an option nor one of an option's choices.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from quota_ledger.cli import parser

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "cli-reference.md"
HELP = {"-h", "--help"}
WORD = re.compile(r"--?[A-Za-z][\w-]*|[a-z][a-z-]*")


def commands(
    node: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every command the parser runs (the leaves of its tree), by the words that name it."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for action in node._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found |= commands(child, (*path, name))
    return found or {path: node}


def options(node: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        action for action in node._actions if action.option_strings and not HELP & set(action.option_strings)
    ]


def synopsis() -> str:
    text = REFERENCE.read_text(encoding="utf-8")
    section = text.split("## Commands", 1)[1]
    block = re.search(r"^```\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert block, "docs/cli-reference.md has a synopsis block under ## Commands"
    return re.sub(r"\([^)]*\)", " ", block.group(1))  # remarks in parentheses


def segments(text: str, names: list[tuple[str, ...]]) -> tuple[list[str], dict[tuple[str, ...], list[str]]]:
    """The words before the first command (the global options), and the words after each command."""
    words = WORD.findall(text)
    longest_first = sorted(names, key=len, reverse=True)
    head: list[str] = []
    found: dict[tuple[str, ...], list[str]] = {}
    current = head
    at = 0
    while at < len(words):
        name = next((n for n in longest_first if tuple(words[at : at + len(n)]) == n), None)
        if name is None:
            current.append(words[at])
            at += 1
            continue
        assert name not in found, f"{' '.join(name)} appears twice in the synopsis"
        current = found[name] = []
        at += len(name)
    return head, found


ROOT_PARSER = parser.build()
COMMANDS = commands(ROOT_PARSER)
GLOBAL = options(ROOT_PARSER)
GLOBAL_STRINGS = {string for action in GLOBAL for string in action.option_strings}
HEAD, SEGMENTS = segments(synopsis(), list(COMMANDS))


def own_options(command: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in options(command) if not GLOBAL_STRINGS & set(action.option_strings)]


def test_every_command_of_the_parser_is_in_the_reference() -> None:
    missing = [" ".join(name) for name in COMMANDS if name not in SEGMENTS]
    assert missing == []


def test_every_global_option_is_on_the_first_line() -> None:
    missing = [action.option_strings for action in GLOBAL if not set(action.option_strings) & set(HEAD)]
    assert missing == []
    assert {word for word in HEAD if word not in GLOBAL_STRINGS} <= {"quota-ledger", *HELP}


@pytest.mark.parametrize("name", list(COMMANDS), ids=" ".join)
def test_the_reference_gives_a_command_its_options_and_no_others(name: tuple[str, ...]) -> None:
    own = own_options(COMMANDS[name])
    words = SEGMENTS.get(name, [])
    missing = [action.option_strings for action in own if not set(action.option_strings) & set(words)]
    known = {string for action in own for string in action.option_strings} | GLOBAL_STRINGS
    choices = {str(choice) for action in own for choice in action.choices or ()}
    unknown = [word for word in words if word not in known | choices]
    assert (missing, unknown) == ([], [])


def test_the_check_sees_a_missing_option_and_an_unknown_word() -> None:
    text = "quota-ledger --db URL COMMAND\n  tokens add NAME --role admin | frobnicate"
    head, found = segments(text, list(COMMANDS))
    assert head == ["quota-ledger", "--db"]
    assert found[("tokens", "add")] == ["--role", "admin", "frobnicate"]
    add = own_options(COMMANDS[("tokens", "add")])
    assert {"--replace"} <= {string for action in add for string in action.option_strings}
