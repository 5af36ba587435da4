"""Kubernetes quantities, pkg/api/resource/quantity_test.go (kubernetes/apimachinery).

TestQuantityParse: every row's value, read as the ledger reads a request: whole base units
rounded up, which is what upstream's ``Value()`` (bytes, counts) and ``MilliValue()`` (cpu)
give; then the row with a ``+`` and with a ``-`` in front, and the strings that must not
parse. TestQuantityParseEmit: the canonical text of a parsed memory amount.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from quota_ledger.model.errors import InvalidQuantity
from quota_ledger.model.quantity import MAX_QUANTITY, format_quantity, parse_fraction, parse_quantity

TEST = "TestQuantityParse"
KI, MI, GI, TI, PI, EI = (1024**n for n in range(1, 7))
#: upstream's ``maxAllowed``: what a quantity past int64 saturates to
MAX_ALLOWED = 2**63 - 1


def dec(value: float | int, scale: int) -> Fraction:
    """upstream's ``decQuantity(value, scale, format)``: value x 10^scale."""
    return Fraction(value) * Fraction(10) ** scale


# (input, upstream's value), in the order of the upstream table
PARSE = [
    ("0", dec(0, 0)), ("0n", dec(0, 0)), ("0u", dec(0, 0)), ("0m", dec(0, 0)), ("0Ki", dec(0, 0)),
    ("0k", dec(0, 0)), ("0Mi", dec(0, 0)), ("0M", dec(0, 0)), ("0Gi", dec(0, 0)), ("0G", dec(0, 0)),
    ("0Ti", dec(0, 0)), ("0T", dec(0, 0)),
    ("1", dec(1, 0)),
    ("1Ki", dec(KI, 0)), ("8Ki", dec(8 * KI, 0)), ("7Mi", dec(7 * MI, 0)), ("6Gi", dec(6 * GI, 0)),
    ("5Ti", dec(5 * TI, 0)), ("4Pi", dec(4 * PI, 0)), ("3Ei", dec(3 * EI, 0)),
    ("10Ti", dec(10 * TI, 0)), ("100Ti", dec(100 * TI, 0)),
    ("5n", dec(5, -9)), ("4u", dec(4, -6)), ("3m", dec(3, -3)), ("9", dec(9, 0)), ("8k", dec(8, 3)),
    ("50k", dec(5, 4)), ("7M", dec(7, 6)), ("6G", dec(6, 9)), ("5T", dec(5, 12)), ("40T", dec(4, 13)),
    ("300T", dec(3, 14)), ("2P", dec(2, 15)), ("1E", dec(1, 18)),
    ("1E-3", dec(1, -3)), ("1e3", dec(1, 3)), ("1E6", dec(1, 6)), ("1e9", dec(1, 9)), ("1E12", dec(1, 12)),
    ("1e15", dec(1, 15)), ("1E18", dec(1, 18)),
    ("1e14", dec(1, 14)), ("1e13", dec(1, 13)), ("1e3", dec(1, 3)), ("100.035k", dec(100035, 0)),
    ("0.001", dec(1, -3)), ("0.0005k", dec(5, -1)), ("0.005", dec(5, -3)), ("0.05", dec(5, -2)),
    ("0.5", dec(5, -1)), ("0.00050k", dec(5, -1)), ("0.00500", dec(5, -3)), ("0.05000", dec(5, -2)),
    ("0.50000", dec(5, -1)), ("0.5e0", dec(5, -1)), ("0.5e-1", dec(5, -2)), ("0.5e-2", dec(5, -3)),
    ("0.5e0", dec(5, -1)), ("10.035M", dec(10035, 3)),
    ("1.2e3", dec(12, 2)), ("1.3E+6", dec(13, 5)), ("1.40e9", dec(14, 8)), ("1.53E12", dec(153, 10)),
    ("1.6e15", dec(16, 14)), ("1.7E18", dec(17, 17)),
    ("9.01", dec(901, -2)), ("8.1k", dec(81, 2)), ("7.123456M", dec(7123456, 0)),
    ("6.987654321G", dec(6987654321, 0)), ("5.444T", dec(5444, 9)), ("40.1T", dec(401, 11)),
    ("300.2T", dec(3002, 11)), ("2.5P", dec(25, 14)), ("1.01E", dec(101, 16)),
    ("3.001n", dec(4, -9)), ("1.1E-9", dec(2, -9)), ("0.0000000001", dec(1, -9)),
    ("0.0000000005", dec(1, -9)), ("0.00000000050", dec(1, -9)), ("0.5e-9", dec(1, -9)),
    ("0.9n", dec(1, -9)), ("0.00000012345", dec(124, -9)), ("0.00000012354", dec(124, -9)),
    ("9Ei", Fraction(MAX_ALLOWED)), ("9223372036854775807Ki", Fraction(MAX_ALLOWED)), ("12E", dec(12, 18)),
    ("100.035Ki", dec(10243584, -2)), ("0.5Mi", dec(MI // 2, 0)), ("0.05Gi", dec(536870912, -1)),
    ("0.025Ti", dec(274877906944, -1)),
    ("0.000000000001Ki", dec(2, -9)), (".001", dec(1, -3)), (".0001k", dec(100, -3)), ("1.", dec(1, 0)),
    ("1.G", dec(1, 9)),
]  # fmt: skip
INVALID = ["1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-", " 1", "1 ", ""]

TOO_LARGE = "values of 2^63 base units and over are refused, never saturated to 2^63-1"
NEGATIVE = "negative quantities are refused: a request cannot give resources back"


def _ledger_units(resource: str, value: Fraction) -> int:
    """upstream's Value() (round up) or, for cpu, MilliValue() (round up, in milli-cores)."""
    return math.ceil(value * (1000 if resource == "cpu" else 1))


def _cases() -> list[object]:
    found = []
    for resource in ("memory", "cpu"):
        for sign in ("", "+", "-"):
            for text, value in PARSE:
                units = _ledger_units(resource, value)
                reason = None
                if sign == "-" and value != 0:
                    reason = NEGATIVE
                elif units >= MAX_ALLOWED:
                    reason = TOO_LARGE
                suffix = "-differs" if reason else ""
                found.append(
                    pytest.param(
                        resource, sign + text, units, reason, id=f"{TEST}-{resource}-{sign}{text}{suffix}"
                    )
                )
    return found


@pytest.mark.parametrize(("resource", "text", "units", "reason"), _cases())
def test_quantity_parse(resource: str, text: str, units: int, reason: str | None) -> None:
    if reason is None:
        assert parse_quantity(resource, text) == units
        return
    # the expected difference: the ledger refuses what upstream reads (negative, or saturated)
    with pytest.raises(InvalidQuantity):
        parse_quantity(resource, text)
    assert units < 0 or units >= MAX_ALLOWED or text.startswith("-")


@pytest.mark.parametrize("text", INVALID, ids=lambda text: f"{TEST}-invalid-{text!r}")
def test_quantity_parse_invalid(text: str) -> None:
    with pytest.raises(InvalidQuantity):
        parse_quantity("memory", text)


WHOLE_UNITS = "the ledger counts whole bytes: a fraction of a byte is rounded up to one"
EMIT = [
    ("1Ki", "1Ki", None), ("1Mi", "1Mi", None), ("1Gi", "1Gi", None), ("1024Mi", "1Gi", None),
    ("1000M", "1G", None), (".001Ki", "1024m", WHOLE_UNITS), (".000001Ki", "1024u", WHOLE_UNITS),
    (".000000001Ki", "1024n", WHOLE_UNITS), (".000000000001Ki", "2n", WHOLE_UNITS),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "canonical", "reason"),
    [pytest.param(*row, id=f"TestQuantityParseEmit-{row[0]}{'-differs' if row[2] else ''}") for row in EMIT],
)
def test_quantity_parse_emit(text: str, canonical: str, reason: str | None) -> None:
    shown = format_quantity("memory", parse_quantity("memory", text))
    if reason is None:
        assert shown == canonical
    else:
        assert shown != canonical
        assert shown == str(math.ceil(parse_fraction(text)))  # rounded up to whole bytes
    assert MAX_QUANTITY == MAX_ALLOWED
