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

from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidQuantity, InvalidRequest

MAX_QUANTITY = 2**63 - 1
#: the counter resource that holds running-application counts (maxapplications)
APPLICATIONS = "applications"
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
#: longer texts are refused outright: no real quantity needs them, and they would cost time
MAX_TEXT_LENGTH = 128
#: |decimal exponent| beyond which parse_fraction refuses to build the exact value
_MAX_EXACT_EXPONENT = 400


def is_milli(resource: str) -> bool:
    """Whether ``resource`` is counted in milli-units (milli-cores)."""
    return resource in MILLI_RESOURCES


def _split(text: str, resource: str) -> tuple[bool, str, int, Fraction]:
    """``(negative, significant digits, decimal scale, suffix multiplier)`` of a quantity text.

    The value is ``int(digits) * 10**scale * multiplier``; ``digits`` has no leading zeros
    (empty for zero). Nothing here grows with the size of the exponent.
    """
    if len(text) > MAX_TEXT_LENGTH:
        raise InvalidQuantity(resource, text, f"longer than {MAX_TEXT_LENGTH} characters")
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise InvalidQuantity(resource, text, "not a number with an optional suffix")
    sign, number, suffix = match.groups()
    whole, _, frac = number.partition(".")
    scale = -len(frac)
    if suffix in _BINARY:
        multiplier = Fraction(_BINARY[suffix])
    elif suffix in _DECIMAL:
        multiplier = _DECIMAL[suffix]
    elif (exp := _EXPONENT.fullmatch(suffix)) is not None:
        multiplier = Fraction(1)
        scale += int(exp.group(1))
    else:
        raise InvalidQuantity(resource, text, f"unknown suffix {suffix!r}")
    return sign == "-", (whole + frac).lstrip("0"), scale, multiplier


def parse_fraction(text: str, *, resource: str = "") -> Fraction:
    """The exact value of a Kubernetes quantity string, sign included."""
    negative, digits, scale, multiplier = _split(text, resource)
    if not digits:
        return Fraction(0)
    if abs(scale) > _MAX_EXACT_EXPONENT:
        raise InvalidQuantity(resource, text, "exponent out of range")
    value = int(digits) * Fraction(10) ** scale * multiplier
    return -value if negative else value


def parse_quantity(resource: str, value: object, *, milli: bool | None = None, exact: bool = False) -> int:
    """Parse one resource amount into integer base units.

    ``value`` is a quantity string (``"250m"``, ``"1Gi"``, ``"1e3"``) or a Python ``int``, which
    means the same as its decimal text (so ``vcore=2`` is two cores, 2000 milli-cores, as in
    YuniKorn's configuration). Floats are refused because they are not exact. With ``exact``
    (a request: reserve, commit, release) a fraction of the resource's unit is refused instead of
    rounded up: ``fpga=1.5`` is an error, not two FPGAs, wherever it comes from.
    """
    if milli is None:
        milli = is_milli(resource)
    factor = 1000 if milli else 1
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidQuantity(
            resource, repr(value), f"expected a quantity string or an int, not {type(value).__name__}"
        )
    if isinstance(value, int):
        if value < 0 or value * factor > MAX_QUANTITY:
            # str() of a huge int is itself refused by Python (more than 4300 digits).
            text = str(value) if abs(value) < 10**100 else f"<int of {value.bit_length()} bits>"
            raise InvalidQuantity(resource, text, "negative" if value < 0 else "exceeds 2^63-1")
        return value * factor
    if value == "":
        raise InvalidQuantity(resource, value, "empty")
    negative, digits, scale, multiplier = _split(value, resource)
    if not digits:
        return 0
    if negative:
        raise InvalidQuantity(resource, value, "negative")
    # The value lies in [10**(magnitude-1), 10**magnitude) * multiplier, and the multiplier is
    # between 1e-9 and 2**60 < 1e19: decide the extremes without building huge numbers.
    magnitude = len(digits) + scale
    if magnitude > 40:
        raise InvalidQuantity(resource, value, "exceeds 2^63-1")
    if magnitude < -40:  # positive and far below one unit: rounds up to one
        units, whole = 1, False
    else:
        amount = int(digits) * Fraction(10) ** scale * multiplier
        units = math.ceil(amount * factor)
        whole = units == amount * factor
    if exact and not whole:
        unit = "milli-core" if milli else "unit"
        raise InvalidQuantity(
            resource, value, f"{resource} is counted in whole {unit}s: a fraction would round up to {units}"
        )
    if units > MAX_QUANTITY:
        raise InvalidQuantity(resource, value, "exceeds 2^63-1")
    return units


def validate_resource_name(resource: object) -> str:
    """Return ``resource`` if it is a valid resource name, else raise :class:`InvalidRequest`."""
    return validation.resource(resource)


def parse_resources(resources: Mapping[str, object], *, exact: bool = False) -> dict[str, int]:
    """Parse a resource mapping into ``{name: base units}``, sorted by name (``exact``: see
    :func:`parse_quantity`)."""
    if not isinstance(resources, Mapping):
        raise InvalidRequest("resources must be a mapping of resource name to quantity")
    parsed = {
        validate_resource_name(name): parse_quantity(name, value, exact=exact)
        for name, value in resources.items()
    }
    if APPLICATIONS in parsed:
        # The ledger counts running applications under this name; nobody may reserve it.
        raise InvalidQuantity(APPLICATIONS, str(resources[APPLICATIONS]), "reserved resource name")
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
    """Render base units as the shortest exact Kubernetes quantity (``4Gi``, ``1T``, ``250m``)."""
    if is_milli(resource):
        return str(units // 1000) if units % 1000 == 0 else f"{units}m"
    candidates = [str(units)]
    for suffix, factor in [*_BINARY.items(), *((k, int(v)) for k, v in _DECIMAL.items() if v > 1)]:
        if units and units % factor == 0:
            candidates.append(f"{units // factor}{suffix}")
    return min(candidates, key=len)


#: the Kubernetes ResourceQuota names whose amounts the ledger keeps in milli-cores
KUBE_CPU_NAMES = frozenset({"cpu", "requests.cpu", "limits.cpu"})
_BYTE_NAMES = frozenset({"memory", "storage", "ephemeral-storage"})


def is_bytes(resource: str) -> bool:
    """Whether ``resource`` counts bytes: memory, storage, ephemeral storage and huge pages,
    also under ``requests.``/``limits.`` and a storage class's ``.../requests.storage``."""
    name = resource.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
    return name in _BYTE_NAMES or name.startswith("hugepages-")


def format_human(resource: str, units: int, *, milli: bool | None = None) -> str:
    """Base units as a person reads them, in the resource's own unit, as ``kubectl describe
    quota`` prints: cores or milli-cores for cpu-like resources (``4``, ``250m``), binary
    suffixes for bytes when exact (``8Gi``, ``1536Mi``; else a decimal suffix or plain bytes),
    plain numbers for counts. Negative amounts (an over-limit ``available``) keep their sign.

    ``milli`` overrides whether the amount is in milli-units (a ResourceQuota's ``requests.cpu``
    is; a queue resource of that name is not). JSON output keeps base units: this is for text.
    """
    if units < 0:
        return "-" + format_human(resource, -units, milli=milli)
    if is_milli(resource) if milli is None else milli:
        return str(units // 1000) if units % 1000 == 0 else f"{units}m"
    if units == 0 or not is_bytes(resource):
        return str(units)
    for suffixes in (_BINARY, {k: int(v) for k, v in _DECIMAL.items() if v > 1}):
        for suffix, factor in reversed(suffixes.items()):
            if units % factor == 0:
                return f"{units // factor}{suffix}"
    return str(units)
