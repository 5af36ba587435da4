"""The values of command-line arguments that argparse does not parse: ``RES=QTY`` pairs and
the text of a FILE argument. Both raise the ledger's typed error, so a bad value exits 1 with
the usual ``error:`` line, as the engine's own checks do. Also :func:`seconds`, an option's
``type`` that argparse refuses with exit 2 as it does any malformed option."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from quota_ledger.model.errors import InvalidRequest


def resource_pairs(items: Sequence[str], *, allow_none: bool = False) -> dict[str, Any]:
    """``["vcore=2", "memory=1Gi"]`` as a mapping; with ``allow_none``, ``RES=none`` maps to None."""
    result: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidRequest(f"expected RESOURCE=QUANTITY, got {item!r}", field=item)
        result[name] = None if allow_none and value.lower() == "none" else value
    return result


def read_source(path: str) -> str:
    """The text of a FILE argument (``-`` for standard input); an unreadable file is a typed error."""
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as error:
        raise InvalidRequest(f"cannot read {path}: {error.strerror}", field="file") from error


def seconds(text: str) -> float:
    """An option's value in seconds: a number above 0 (argparse's ``type``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be more than 0: {text!r}")
    return value
