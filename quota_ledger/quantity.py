"""Exact Kubernetes quantity parsing into integer base units.

The grammar is Kubernetes' (``k8s.io/apimachinery/pkg/api/resource``)::

    <quantity>     ::= <sign>? <number> <suffix>
    <number>       ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>       ::= Ki|Mi|Gi|Ti|Pi|Ei | n|u|m|""|k|M|G|T|P|E | (e|E)<sign>?<digits>

Values are computed with :class:`fractions.Fraction`, never floats. CPU-like resources
(``vcore`` and ``cpu``) are counted in milli-cores, everything else in plain units or bytes;
fractions that do not come out whole round up, as Kubernetes' ``Value()`` and
``MilliValue()`` do. Negative values and values of 2^63 or more are refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction

from quota_ledger.errors import InvalidQuantity, InvalidRequest

MAX_QUANTITY = 2**63 - 1
MILLI_RESOURCES = frozenset({"vcore", "cpu"})

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_NUMBER = re.compile(r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(.*)", re.ASCII | re.DOTALL)
_EXPONENT = re.compile(r"[eE]([+-]?\d+)", re.ASCII)
_RESOURCE_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?", re.ASCII)
# Exponents beyond this cannot produce a value below 2^63 that is not zero; refusing them early
# keeps a hostile "1e999999999" from costing a huge Fraction.
_MAX_EXPONENT = 40


def is_milli(resource: str) -> bool:
    """Whether ``resource`` is counted in milli-units (milli-cores)."""
    return resource in MILLI_RESOURCES


def parse_fraction(text: str, *, resource: str = "") -> Fraction:
    """The exact value of a Kubernetes quantity string, sign included."""
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise InvalidQuantity(resource, text, "not a number with an optional suffix")
    sign, digits, suffix = match.groups()
    if "." in digits:
        whole, _, frac = digits.partition(".")
        value = Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
    else:
        value = Fraction(int(digits))
    if suffix in _BINARY:
        value *= _BINARY[suffix]
    elif suffix in _DECIMAL:
        value *= _DECIMAL[suffix]
    elif (exp := _EXPONENT.fullmatch(suffix)) is not None:
        exponent = int(exp.group(1))
        if exponent > _MAX_EXPONENT and value != 0:
            raise InvalidQuantity(resource, text, "exceeds 2^63-1")
        value *= Fraction(10) ** max(exponent, -_MAX_EXPONENT)
    else:
        raise InvalidQuantity(resource, text, f"unknown suffix {suffix!r}")
    return -value if sign == "-" else value


def parse_quantity(resource: str, value: object, *, milli: bool | None = None) -> int:
    """Parse one resource amount into integer base units.

    ``value`` is a quantity string (``"250m"``, ``"1Gi"``, ``"1e3"``) or a Python ``int``, which
    means the same as its decimal text (so ``vcore=2`` is two cores, 2000 milli-cores, as in
    YuniKorn's configuration). Floats are refused because they are not exact.
    """
    if milli is None:
        milli = is_milli(resource)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidQuantity(
            resource, value, f"expected a quantity string or an int, not {type(value).__name__}"
        )
    text = str(value)
    if text == "":
        raise InvalidQuantity(resource, text, "empty")
    exact = parse_fraction(text, resource=resource)
    if exact < 0:
        raise InvalidQuantity(resource, text, "negative")
    units = math.ceil(exact * 1000) if milli else math.ceil(exact)
    if units > MAX_QUANTITY:
        raise InvalidQuantity(resource, text, "exceeds 2^63-1")
    return units


def validate_resource_name(resource: object) -> str:
    """Return ``resource`` if it is a valid resource name, else raise :class:`InvalidRequest`."""
    if not isinstance(resource, str) or len(resource) > 253 or not _RESOURCE_NAME.fullmatch(resource):
        raise InvalidRequest(
            f"invalid resource name {resource!r}: use letters, digits, '-', '_', '.', '/' "
            "(at most 253, starting and ending with a letter or digit)",
            field=str(resource),
        )
    return resource


def parse_resources(resources: Mapping[str, object]) -> dict[str, int]:
    """Parse a resource mapping into ``{name: base units}``, sorted by name."""
    if not isinstance(resources, Mapping):
        raise InvalidRequest("resources must be a mapping of resource name to quantity")
    parsed = {validate_resource_name(name): parse_quantity(name, value) for name, value in resources.items()}
    return dict(sorted(parsed.items()))


def parse_limits(limits: Mapping[str, object]) -> dict[str, int | None]:
    """Like :func:`parse_resources`, but ``None`` (no limit) is allowed as a value."""
    if not isinstance(limits, Mapping):
        raise InvalidRequest("limits must be a mapping of resource name to quantity or None")
    parsed: dict[str, int | None] = {}
    for name, value in limits.items():
        validate_resource_name(name)
        parsed[name] = None if value is None else parse_quantity(name, value)
    return dict(sorted(parsed.items()))


def format_quantity(resource: str, units: int) -> str:
    """Render base units as a short Kubernetes quantity (``4Gi``, ``250m``, ``2``)."""
    if is_milli(resource):
        return str(units // 1000) if units % 1000 == 0 else f"{units}m"
    if units == 0:
        return "0"
    for suffix, factor in reversed(_BINARY.items()):
        if units % factor == 0:
            return f"{units // factor}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k"):
        factor = int(_DECIMAL[suffix])
        if units % factor == 0:
            return f"{units // factor}{suffix}"
    return str(units)
