"""Every command's ``--help`` explains itself: help text for each argument, at least two
examples and the exit codes; the global options are described once, in ``quota-ledger --help``."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from quota_ledger.cli import help_text, parser, service_commands
from quota_ledger.cli.exit_codes import EXIT_OVER_QUOTA


def test_the_epilog_lists_examples_exit_codes_and_points_to_the_global_options() -> None:
    text = help_text.epilog(
        ["quota-ledger usage", "quota-ledger usage root.a  # one subtree"],
        {EXIT_OVER_QUOTA: "over quota"},
    )
    assert text.splitlines()[:3] == [
        "examples:",
        "  quota-ledger usage",
        "  quota-ledger usage root.a  # one subtree",
    ]
    assert "exit codes:\n  0  ok\n  1  error" in text
    assert "  3  over quota" in text
    assert text.endswith(help_text.GLOBAL_OPTIONS_NOTE)


def test_a_command_with_fewer_than_two_examples_is_refused() -> None:
    with pytest.raises(ValueError, match="two examples"):
        help_text.epilog(["quota-ledger usage"])


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


ROOT = parser.build()
COMMANDS = commands(ROOT)
GLOBAL_OPTIONS = [
    string
    for action in ROOT._actions
    if action.option_strings and action.help is not argparse.SUPPRESS
    for string in action.option_strings
    if string not in ("-h", "--help", "--version")
]


def section(text: str, title: str) -> list[str]:
    """The lines of a help text's section (``examples:``), up to the next blank line."""
    lines = text.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line.strip() for line in lines]


def test_every_command_is_walked() -> None:
    assert {("reserve",), ("db", "upgrade"), ("tokens", "add"), ("config", "diff")} <= set(COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS), ids=" ".join)
def test_a_command_help_explains_every_argument_with_examples_and_exit_codes(name: tuple[str, ...]) -> None:
    command = COMMANDS[name]
    shown = [a for a in command._actions if a.help is not argparse.SUPPRESS]
    unexplained = [a.option_strings or a.dest for a in shown if not (a.help or "").strip()]
    assert unexplained == []
    text = command.format_help()
    examples = section(text, "examples")
    assert len(examples) >= 2
    assert all(example.startswith("quota-ledger ") or "| quota-ledger " in example for example in examples)
    codes = section(text, "exit codes")
    assert [line.split()[0] for line in codes][:3] == ["0", "1", "2"]
    assert text.rstrip().endswith(help_text.GLOBAL_OPTIONS_NOTE)


@pytest.mark.parametrize("name", list(COMMANDS), ids=" ".join)
def test_a_command_help_leaves_the_global_options_to_the_top(name: tuple[str, ...]) -> None:
    options = COMMANDS[name].format_help().split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    listed = {word.rstrip(",") for line in options.splitlines() for word in line.split()[:2]}
    assert listed.isdisjoint(GLOBAL_OPTIONS)


@pytest.mark.parametrize("name", list(COMMANDS), ids=" ".join)
def test_a_command_examples_are_command_lines_the_parser_takes(name: tuple[str, ...]) -> None:
    for example in section(COMMANDS[name].format_help(), "examples"):
        line = example.split("  # ", 1)[0].split(" | ")[-1]
        line = re.split(r" [<>] ", line, maxsplit=1)[0]
        words = shlex.split(line)
        assert words[0] == "quota-ledger"
        args = ROOT.parse_args(words[1:])
        assert args.handler is COMMANDS[name].get_default("handler"), example


def test_the_top_help_lists_every_global_option_once() -> None:
    text = ROOT.format_help()
    assert {"--db", "--url", "--token", "--token-file", "--json", "-v", "--settings"} <= set(GLOBAL_OPTIONS)
    for option in GLOBAL_OPTIONS:  # at the start of its line, or after its short form (-v, --verbose)
        assert len(re.findall(rf"^\s+(?:-\w, )?{re.escape(option)}(?=[ ,])", text, re.MULTILINE)) == 1, option


def test_the_token_roles_are_those_the_service_knows() -> None:
    from quota_ledger.runtime import tokens

    assert service_commands.ROLES == tokens.ROLES
