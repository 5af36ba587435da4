"""YuniKorn's quantity tests, pkg/common/resources/quantity_test.go (apache/yunikorn-core).

TestParseQuantity is a configured amount of any key but ``vcore``; TestParseVCore is one of
``vcore`` (milli-cores). Upstream's error fragment (``overflow`` or ``invalid``) is compared
with the reason the ledger gives.
"""

from __future__ import annotations

import pytest

from quota_ledger.config.amounts import parse_config_quantity
from quota_ledger.model.errors import InvalidQuantity

K, M, G, T, P, E = (1000**n for n in range(1, 7))
Ki, Mi, Gi, Ti, Pi, Ei = (1024**n for n in range(1, 7))

PARSE_QUANTITY = {
    "0": ("0", 0),
    "1": ("1", 1),
    "spaces": (" 25k ", 25 * K),
    "spaces2": (" 25  k ", 25 * K),
    "max": ("9223372036854775807", 9223372036854775807),
    "overflow": ("9223372036854775808", "overflow"),
    "overflow2": ("1000E", "overflow"),
    "wrong unit": ("5X", "invalid"),
    "milli": ("500m", "invalid"),
    "negative": ("-1", "invalid"),
    "2k": ("2k", 2 * K),
    "3M": ("3M", 3 * M),
    "4G": ("4G", 4 * G),
    "5T": ("5T", 5 * T),
    "6P": ("6P", 6 * P),
    "7E": ("7E", 7 * E),
    "2Ki": ("2Ki", 2 * Ki),
    "3Mi": ("3Mi", 3 * Mi),
    "4Gi": ("4Gi", 4 * Gi),
    "5Ti": ("5Ti", 5 * Ti),
    "6Pi": ("6Pi", 6 * Pi),
    "7Ei": ("7Ei", 7 * Ei),
}
PARSE_VCORE = {
    "0": ("0", 0),
    "1": ("1", 1000),
    "spaces": (" 25k ", 25 * K * 1000),
    "spaces2": (" 25  k ", 25 * K * 1000),
    "max": ("9223372036854775", 9223372036854775000),
    "overflow": ("9223372036854776", "overflow"),
    "overflow2": ("1000P", "overflow"),
    "wrong unit": ("5X", "invalid"),
    "500m": ("500m", 500),
    "negative": ("-1", "invalid"),
    "2k": ("2k", 2 * K * 1000),
    "3M": ("3M", 3 * M * 1000),
    "4G": ("4G", 4 * G * 1000),
    "5T": ("5T", 5 * T * 1000),
    "6P": ("6P", 6 * P * 1000),
    "7E": ("7E", "overflow"),
    "2Ki": ("2Ki", 2 * 1000 * Ki),
    "3Mi": ("3Mi", 3 * 1000 * Mi),
    "4Gi": ("4Gi", 4 * 1000 * Gi),
    "5Ti": ("5Ti", 5 * 1000 * Ti),
    "6Pi": ("6Pi", 6 * 1000 * Pi),
    "7Ei": ("7Ei", "overflow"),
}
CASES = [
    pytest.param(key, text, want, id=f"{test}-{name}")
    for test, key, table in (
        ("TestParseQuantity", "memory", PARSE_QUANTITY),
        ("TestParseVCore", "vcore", PARSE_VCORE),
    )
    for name, (text, want) in table.items()
]


@pytest.mark.parametrize(("key", "text", "want"), CASES)
def test_configured_quantity(key: str, text: str, want: int | str) -> None:
    if isinstance(want, int):
        assert parse_config_quantity(key, text) == want
        return
    with pytest.raises(InvalidQuantity) as caught:
        parse_config_quantity(key, text)
    # upstream's "invalid" covers both an invalid quantity and an invalid suffix
    assert want in caught.value.reason
