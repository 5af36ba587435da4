"""Every command's ``--help`` explains itself: help text for each argument, at least two
examples and the exit codes; the global options are described once, in ``quota-ledger --help``."""

from __future__ import annotations

import pytest

from quota_ledger.cli import help_text
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
