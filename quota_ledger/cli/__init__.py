"""The ``quota-ledger`` command line: its parser and commands, their output, and the remote client."""

from __future__ import annotations

from quota_ledger.cli.app import main

__all__ = ["main"]
