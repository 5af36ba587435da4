"""The ``quota-ledger`` command line: its parser and commands, their output, and the remote client."""

from __future__ import annotations

from quota_ledger.cli.app import console_main, main

__all__ = ["console_main", "main"]
