"""YuniKorn's configuration quantities (``pkg/common/resources/quantity.go``), not Kubernetes'.

A configured amount is digits with an optional suffix and nothing else: no sign, no
decimals, no exponent. Only the key exactly ``vcore`` is counted in milli-cores (and only it
accepts the ``m`` suffix, meaning "already milli"); every other key is a plain count, memory in
bytes. This differs on purpose from :mod:`quota_ledger.model.quantity`, which parses request amounts
the Kubernetes way: a configuration must mean what it means to YuniKorn.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from quota_ledger.model.errors import InvalidQuantity, InvalidRequest
from quota_ledger.model.quantity import MAX_QUANTITY, validate_resource_name

#: the one key YuniKorn parses as milli-cores (``common.CPU``)
VCORE = "vcore"
#: counted by the ledger itself (running applications), so no configuration may set it
RESERVED_RESOURCE = "applications"

_QUANTITY = re.compile(r"([0-9]+)\s*(([mkKMGTPE]i?)?)", re.ASCII)
_MULTIPLIERS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
#: ints beyond this many bits are refused before ``str()``, which Python limits to 4300 digits
_MAX_INT_BITS = 256


def _display(value: object) -> str:
    """``str(value)``, except for ints too long for ``str()``."""
    if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        return f"<int of {value.bit_length()} bits>"
    return str(value)


def _text(resource: str, value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > _MAX_INT_BITS:
            reason = "invalid quantity" if value < 0 else "overflow"
            raise InvalidQuantity(resource, _display(value), reason)
        return str(value)
    raise InvalidQuantity(resource, _display(value), "invalid quantity")


def parse_config_quantity(resource: str, value: object) -> int:
    """Parse one configured amount of ``resource`` as YuniKorn does.

    ``value`` is a quantity string or a Python ``int`` (taken as its decimal text, so
    ``vcore: 2`` is 2000 milli-cores). Anything else, including floats and bools, is refused.

    Raises :class:`~quota_ledger.model.errors.InvalidQuantity` with the reason ``invalid quantity``
    (not digits and a suffix), ``invalid suffix`` (``K``, ``ki``, or ``m`` on a key other
    than ``vcore``) or ``overflow`` (the result does not fit in a signed 64-bit integer).
    """
    text = _text(resource, value)
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise InvalidQuantity(resource, text, "invalid quantity")
    digits, suffix = match.group(1), match.group(2)
    milli = resource == VCORE
    if suffix == "m" and milli:
        result = int(digits)
    elif suffix in _MULTIPLIERS:
        result = int(digits) * _MULTIPLIERS[suffix] * (1000 if milli else 1)
    else:
        raise InvalidQuantity(resource, text, "invalid suffix")
    if result > MAX_QUANTITY:
        raise InvalidQuantity(resource, text, "overflow")
    return result


def parse_config_resources(values: Mapping[str, object]) -> dict[str, int]:
    """Parse a configured resource map (``max``, ``guaranteed``, ``maxresources``), sorted by name.

    Names must be valid resource names (:func:`quota_ledger.model.quantity.validate_resource_name`,
    which raises :class:`~quota_ledger.model.errors.InvalidRequest`); ``applications`` is reserved
    and refused with :class:`~quota_ledger.model.errors.InvalidQuantity`.
    """
    parsed: dict[str, int] = {}
    for name, value in values.items():
        validate_resource_name(name)
        if name == RESERVED_RESOURCE:
            raise InvalidQuantity(name, _display(value), "reserved resource name")
        parsed[name] = parse_config_quantity(name, value)
    return dict(sorted(parsed.items()))


#: what a configured amount may end with, as :func:`parse_config_quantity` accepts them
SUFFIXES = "k, M, G, T, P, E (powers of 1000) or Ki, Mi, Gi, Ti, Pi, Ei (powers of 1024)"


def describe_error(error: InvalidRequest) -> str:
    """A configured amount's refusal in plain words, naming the suffixes that are valid."""
    if not isinstance(error, InvalidQuantity):
        return str(error)
    resource, text = error.resource, error.text
    if error.reason == "reserved resource name":
        return (
            f"{resource!r} is counted by the ledger itself and cannot be configured as a resource: "
            "use maxapplications"
        )
    if error.reason == "overflow":
        unit = "milli-cores" if resource == VCORE else "units"
        return f"{resource}: {text!r} is too large (at most {MAX_QUANTITY} {unit})"
    milli = " (vcore also takes m, for milli-cores)" if resource == VCORE else ""
    return (
        f"{resource}: {text!r} is not a valid amount: write a whole number with no sign or "
        f"decimals, optionally followed by one of {SUFFIXES}{milli}"
    )
