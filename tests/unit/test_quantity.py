"""Kubernetes quantity parsing: the table of notes A.7, and where the ledger deliberately differs.

The ledger computes ``Value()`` (ceil) for plain resources and ``MilliValue()`` (ceil) for
``vcore``/``cpu``, exactly. It refuses negative values and anything of 2^63 or more instead of
capping (Kubernetes caps BinarySI values such as ``9Ei``) or overflowing int64 (``12E``).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quota_ledger.model.errors import InvalidQuantity, InvalidRequest
from quota_ledger.model.quantity import (
    MAX_QUANTITY,
    format_quantity,
    is_milli,
    parse_fraction,
    parse_limits,
    parse_quantity,
    parse_resources,
    validate_resource_name,
)

#: a value the ledger refuses (negative or >= 2^63) where Kubernetes parses something
REFUSED: Final = None

# (input, Value() ceil -> "memory", MilliValue() ceil -> "vcore"); the row numbers of notes A.7.
VALID_ROWS: Final[list[tuple[str, int | None, int | None]]] = [
    ("250m", 1, 250),  # 1
    ("100m", 1, 100),  # 2
    ("3m", 1, 3),  # 3
    ("0.1m", 1, 1),  # 4
    ("5n", 1, 1),  # 5
    ("4u", 1, 1),  # 6
    ("3.001n", 1, 1),  # 7
    ("0.5", 1, 500),  # 8
    ("1.5", 2, 1500),  # 9
    ("9.01", 10, 9010),  # 10
    ("1", 1, 1000),  # 11
    ("+1", 1, 1000),  # 12
    ("-1", REFUSED, REFUSED),  # 13: negative, refused by the ledger
    ("0", 0, 0),  # 14
    ("8k", 8000, 8_000_000),  # 15
    ("50k", 50_000, 50_000_000),  # 16
    ("100.035k", 100_035, 100_035_000),  # 17
    ("7M", 7_000_000, 7_000_000_000),  # 18
    ("10.035M", 10_035_000, 10_035_000_000),  # 19
    ("1000M", 10**9, 10**12),  # 20
    ("100G", 10**11, 10**14),  # 21
    ("1.G", 10**9, 10**12),  # 22
    ("5T", 5 * 10**12, 5 * 10**15),  # 23
    ("2P", 2 * 10**15, 2 * 10**18),  # 24
    ("1E", 10**18, REFUSED),  # 25: 1e21 milli-units do not fit
    ("12E", REFUSED, REFUSED),  # 26: 1.2e19 >= 2^63
    ("1e3", 1000, 1_000_000),  # 27
    ("1E3", 1000, 1_000_000),  # 28
    ("1E-3", 1, 1),  # 29
    ("1.2e3", 1200, 1_200_000),  # 30
    ("1.3E+6", 1_300_000, 1_300_000_000),  # 31
    ("0.5e-9", 1, 1),  # 32
    ("1Ki", 1024, 1_024_000),  # 33
    ("7Mi", 7_340_032, 7_340_032_000),  # 34
    ("0.5Mi", 524_288, 524_288_000),  # 35
    ("1Gi", 1_073_741_824, 1_073_741_824_000),  # 36
    ("1024Mi", 1_073_741_824, 1_073_741_824_000),  # 37
    ("1.5Gi", 1_610_612_736, 1_610_612_736_000),  # 38
    ("0.05Gi", 53_687_092, 53_687_091_200),  # 39
    ("100.035Ki", 102_436, 102_435_840),  # 40
    ("0.025Ti", 27_487_790_695, 27_487_790_694_400),  # 41
    ("5Ti", 5_497_558_138_880, 5_497_558_138_880_000),  # 42
    ("4Pi", 4_503_599_627_370_496, 4_503_599_627_370_496_000),  # 43
    ("3Ei", 3_458_764_513_820_540_928, REFUSED),  # 44
    ("9Ei", REFUSED, REFUSED),  # 45: Kubernetes caps it to 2^63-1, the ledger refuses
    ("9223372036854775807Ki", REFUSED, REFUSED),  # 46: capped by Kubernetes, refused here
    ("0.000000000001Ki", 1, 1),  # 47
    (".001", 1, 1),  # 48
    ("1.", 1, 1000),  # 49
    ("9999999999999999999", REFUSED, REFUSED),  # 50: exact in Kubernetes, >= 2^63 here
]

# rows 51-60 of notes A.7: invalid for Kubernetes and for the ledger
INVALID_ROWS: Final[list[str]] = [
    "",
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "0.1am",
    "aoeu",
    "Non-Numeric",
    ".5i",
    "1i",
    "-3.01i",
    "-3.01e-",
    " 1",
    "1 ",
    "1K",
    "1ki",
    "1KI",
    "1e",
    "1 Gi",
    "0x10",
    "1_000",
    # more of the same grammar
    ".",
    "+",
    "-",
    "m",
    "Ki",
    "1e+",
    "1e1.5",
    "1mm",
    "1kk",
    "1Gi ",
    "1\n",
    "\uff11",  # FULLWIDTH DIGIT ONE: not an ASCII digit
    "1\u0660",  # ARABIC-INDIC DIGIT ZERO
    "--1",
    "+-1",
    "1.5.",
]


def _expect(resource: str, text: str, expected: int | None) -> None:
    if expected is REFUSED:
        with pytest.raises(InvalidQuantity) as info:
            parse_quantity(resource, text)
        assert info.value.resource == resource
        assert info.value.text == text
    else:
        assert parse_quantity(resource, text) == expected


# -- the table ------------------------------------------------------------------------------------


_VALUE_ROWS: Final = [pytest.param(text, value, id=text) for text, value, _ in VALID_ROWS]
_MILLI_ROWS: Final = [pytest.param(text, milli, id=text) for text, _, milli in VALID_ROWS]


@pytest.mark.parametrize(("text", "expected"), _VALUE_ROWS)
def test_table_value_is_ceil_for_plain_resources(text: str, expected: int | None) -> None:
    _expect("memory", text, expected)
    _expect("nvidia.com/gpu", text, expected)


@pytest.mark.parametrize(("text", "expected"), _MILLI_ROWS)
def test_table_milli_value_is_ceil_for_vcore_and_cpu(text: str, expected: int | None) -> None:
    _expect("vcore", text, expected)
    _expect("cpu", text, expected)


@pytest.mark.parametrize("text", INVALID_ROWS, ids=repr)
@pytest.mark.parametrize("resource", ["memory", "vcore"])
def test_invalid_text_raises_invalid_quantity_naming_input(resource: str, text: str) -> None:
    with pytest.raises(InvalidQuantity) as info:
        parse_quantity(resource, text)
    error = info.value
    assert error.resource == resource
    assert error.text == text
    assert error.field == resource
    assert isinstance(error, InvalidRequest)
    assert repr(text) in str(error)


# -- ledger-specific rules ------------------------------------------------------------------------


def test_negative_values_are_refused() -> None:
    for text in ["-1", "-0.001m", "-1Gi", "-1e3"]:
        with pytest.raises(InvalidQuantity, match="negative"):
            parse_quantity("memory", text)


def test_negative_zero_is_zero() -> None:
    assert parse_quantity("memory", "-0") == 0
    assert parse_quantity("vcore", "-0.0") == 0


def test_boundary_2_pow_63_minus_1_accepted_and_2_pow_63_refused() -> None:
    assert parse_quantity("memory", str(MAX_QUANTITY)) == MAX_QUANTITY
    with pytest.raises(InvalidQuantity, match="2\\^63"):
        parse_quantity("memory", str(MAX_QUANTITY + 1))
    assert parse_quantity("vcore", f"{MAX_QUANTITY}m") == MAX_QUANTITY
    assert parse_quantity("vcore", "9223372036854775.807") == MAX_QUANTITY
    with pytest.raises(InvalidQuantity):
        parse_quantity("vcore", f"{MAX_QUANTITY + 1}m")
    with pytest.raises(InvalidQuantity):
        parse_quantity("vcore", "9223372036854775.8071")


def test_binary_suffix_boundary_7ei_accepted_8ei_refused() -> None:
    assert parse_quantity("memory", "7Ei") == 7 * 2**60
    with pytest.raises(InvalidQuantity):
        parse_quantity("memory", "8Ei")  # exactly 2^63


def test_exponent_boundary() -> None:
    assert parse_quantity("memory", "1e18") == 10**18
    with pytest.raises(InvalidQuantity):
        parse_quantity("memory", "1e19")
    with pytest.raises(InvalidQuantity):
        parse_quantity("memory", "1e41")


def test_zero_with_any_exponent_is_zero() -> None:
    assert parse_quantity("memory", "0e99") == 0
    assert parse_quantity("memory", "0.0e-99") == 0


def test_tiny_positive_exponent_rounds_up_to_one() -> None:
    assert parse_quantity("memory", "1e-41") == 1
    assert parse_quantity("vcore", "1e-999") == 1


def test_large_mantissa_with_negative_exponent_is_exact() -> None:
    # 10^50 * 10^-45 = 10^5. The exponent must not be clamped before the mantissa is applied.
    assert parse_quantity("memory", "1" + "0" * 50 + "e-45") == 100_000


def test_tiny_mantissa_with_large_exponent_is_exact() -> None:
    # 10^-43 * 10^41 = 0.01, which rounds up to 1 (Kubernetes: Value() == 1); not "exceeds 2^63-1".
    assert parse_quantity("memory", "0." + "0" * 42 + "1e41") == 1


def test_zero_with_huge_exponent_is_cheap() -> None:
    # "0e999999999" is zero; computing 10**999999999 on the way would hang the caller.
    code = (
        "from quota_ledger.model.quantity import parse_quantity; "
        "print(parse_quantity('memory', '0e999999999'))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("parse_quantity('memory', '0e999999999') did not finish within 10 s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


_LONG_NUMBERS: Final[list[tuple[str, int | None]]] = [
    ("1" * 5000, REFUSED),
    ("1e" + "1" * 5000, REFUSED),
    ("0." + "0" * 5000 + "1", 1),
    ("1." + "1" * 5000, 2),
]


@pytest.mark.parametrize(
    ("text", "value"), _LONG_NUMBERS, ids=["long-integer", "long-exponent", "long-fraction", "long-mixed"]
)
def test_very_long_numbers_raise_only_invalid_quantity(text: str, value: int | None) -> None:
    # Python's int() refuses more than 4300 digits with ValueError; callers must only ever see
    # QuotaLedgerError (errors.py). A long fraction is a valid small quantity: it may be parsed
    # (ceil) or refused as too long with InvalidQuantity, but must not crash.
    if value is REFUSED:
        with pytest.raises(InvalidQuantity):
            parse_quantity("memory", text)
        return
    try:
        result = parse_quantity("memory", text)
    except InvalidQuantity:
        return
    assert result == value


def test_huge_int_raises_invalid_quantity() -> None:
    with pytest.raises(InvalidQuantity):
        parse_quantity("fpga", 10**5000)


# -- python values --------------------------------------------------------------------------------


def test_int_means_whole_units_so_vcore_int_is_cores() -> None:
    assert parse_quantity("vcore", 2) == 2000
    assert parse_quantity("cpu", 3) == 3000
    assert parse_quantity("fpga", 5) == 5
    assert parse_quantity("memory", 0) == 0
    assert parse_quantity("memory", MAX_QUANTITY) == MAX_QUANTITY


def test_negative_int_refused() -> None:
    with pytest.raises(InvalidQuantity) as info:
        parse_quantity("fpga", -5)
    assert info.value.resource == "fpga"
    assert info.value.text == "-5"


def test_int_too_large_refused() -> None:
    with pytest.raises(InvalidQuantity):
        parse_quantity("memory", MAX_QUANTITY + 1)
    with pytest.raises(InvalidQuantity):
        parse_quantity("vcore", MAX_QUANTITY // 1000 + 1)


@pytest.mark.parametrize("value", [1.0, 0.5, float("nan"), True, False, None, b"1", [1], {"a": 1}])
def test_non_int_non_str_values_refused_with_their_repr_as_text(value: object) -> None:
    with pytest.raises(InvalidQuantity) as info:
        parse_quantity("vcore", value)
    assert info.value.resource == "vcore"
    assert info.value.text == repr(value)


def test_empty_string_refused() -> None:
    with pytest.raises(InvalidQuantity, match="empty"):
        parse_quantity("memory", "")


def test_examples_from_the_readme() -> None:
    assert parse_quantity("memory", "1e3") == 1000
    assert parse_quantity("memory", "100G") == 100_000_000_000
    assert parse_quantity("memory", "1Gi") == 1_073_741_824
    assert parse_quantity("cpu", "250m") == 250
    assert parse_quantity("cpu", "0.1m") == 1


def test_fraction_rounds_up() -> None:
    assert parse_quantity("memory", "0.05Gi") == 53_687_092  # 53687091.2
    assert parse_quantity("memory", "1.0000000001") == 2
    assert parse_quantity("vcore", "1.0001") == 1001
    assert parse_quantity("vcore", "1n") == 1
    assert parse_quantity("fpga", "1n") == 1


def test_whole_values_do_not_round() -> None:
    assert parse_quantity("memory", "2.000") == 2
    assert parse_quantity("vcore", "0.250") == 250


def test_milli_override() -> None:
    assert parse_quantity("memory", "250m", milli=True) == 250
    assert parse_quantity("vcore", "250m", milli=False) == 1
    assert parse_quantity("vcore", "2", milli=False) == 2


def test_is_milli_only_for_cpu_resources() -> None:
    assert is_milli("vcore")
    assert is_milli("cpu")
    assert not is_milli("memory")
    assert not is_milli("requests.cpu")
    assert not is_milli("CPU")


def test_parse_fraction_keeps_sign_and_exact_value() -> None:
    from fractions import Fraction

    assert parse_fraction("-1.5Gi") == Fraction(-3 * 2**29)
    assert parse_fraction("3.001n") == Fraction(3001, 10**12)
    assert parse_fraction("+.5") == Fraction(1, 2)


def test_parse_fraction_error_carries_resource() -> None:
    with pytest.raises(InvalidQuantity) as info:
        parse_fraction("1K", resource="memory")
    assert info.value.resource == "memory"
    assert info.value.text == "1K"


# -- resource names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["vcore", "memory", "nvidia.com/gpu", "example.com/dongle", "a", "9", "A_b-c.d/e", "x" * 253],
)
def test_valid_resource_names_accepted(name: str) -> None:
    assert validate_resource_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "-a", "a-", ".a", "a.", "/a", "a/", "_a", "a_", "a b", "a:b", "é", "x" * 254, "a\n"],
)
def test_invalid_resource_names_refused(name: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_resource_name(name)
    assert info.value.field == name
    assert not isinstance(info.value, InvalidQuantity)


@pytest.mark.parametrize("name", [None, 1, b"vcore", ("vcore",)])
def test_non_string_resource_names_refused(name: object) -> None:
    with pytest.raises(InvalidRequest):
        validate_resource_name(name)


# -- mappings -------------------------------------------------------------------------------------


def test_parse_resources_parses_and_sorts_by_name() -> None:
    parsed = parse_resources({"vcore": "1.5", "memory": "1Gi", "fpga": 2, "nvidia.com/gpu": "0"})
    assert parsed == {"fpga": 2, "memory": 1_073_741_824, "nvidia.com/gpu": 0, "vcore": 1500}
    assert list(parsed) == ["fpga", "memory", "nvidia.com/gpu", "vcore"]


def test_parse_resources_empty_mapping_is_empty() -> None:
    assert parse_resources({}) == {}


def test_parse_resources_refuses_non_mapping() -> None:
    with pytest.raises(InvalidRequest):
        parse_resources([("vcore", 1)])  # type: ignore[arg-type]


def test_parse_resources_refuses_bad_name() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_resources({"vcore": 1, "bad name": 1})
    assert info.value.field == "bad name"


def test_parse_resources_refuses_bad_quantity_naming_resource() -> None:
    with pytest.raises(InvalidQuantity) as info:
        parse_resources({"vcore": 1, "memory": "1K"})
    assert info.value.resource == "memory"
    assert info.value.text == "1K"


def test_parse_resources_refuses_none() -> None:
    with pytest.raises(InvalidQuantity):
        parse_resources({"vcore": None})


def test_parse_limits_allows_none_and_sorts() -> None:
    parsed = parse_limits({"vcore": None, "memory": "2Gi", "fpga": 0})
    assert parsed == {"fpga": 0, "memory": 2 * 2**30, "vcore": None}
    assert list(parsed) == ["fpga", "memory", "vcore"]


def test_parse_limits_refuses_bad_values_and_names() -> None:
    with pytest.raises(InvalidQuantity):
        parse_limits({"vcore": "-1"})
    with pytest.raises(InvalidRequest):
        parse_limits({"-vcore": None})
    with pytest.raises(InvalidRequest):
        parse_limits("vcore=1")  # type: ignore[arg-type]


# -- formatting -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "units", "text"),
    [
        ("memory", 0, "0"),
        ("memory", 4 * 2**30, "4Gi"),
        ("memory", 1024, "1Ki"),
        ("memory", 1000, "1k"),
        ("memory", 1500, "1500"),
        ("memory", 10**6, "1M"),
        ("memory", 10**9, "1G"),
        ("memory", 3 * 10**9, "3G"),
        ("memory", 10**18, "1E"),  # the shortest exact form wins
        ("memory", 10**12, "1T"),
        ("memory", 2**60, "1Ei"),
        ("memory", MAX_QUANTITY, str(MAX_QUANTITY)),
        ("fpga", 5, "5"),
        ("vcore", 0, "0"),
        ("vcore", 250, "250m"),
        ("vcore", 2000, "2"),
        ("vcore", 1, "1m"),
        ("cpu", 1500, "1500m"),
    ],
)
def test_format_quantity_is_short(resource: str, units: int, text: str) -> None:
    assert format_quantity(resource, units) == text


_INTERESTING_UNITS: Final = sorted(
    {0, 1, 999, 1000, 1001, 1023, 1024, 1025, 10**9, 2**30, 3 * 2**40, 10**18, 2**60, 7 * 2**60}
    | {MAX_QUANTITY, MAX_QUANTITY - 1, 10**18 * 9, 2**62}
)


@pytest.mark.parametrize("units", _INTERESTING_UNITS)
@pytest.mark.parametrize("resource", ["memory", "vcore", "fpga"])
def test_format_then_parse_round_trips(resource: str, units: int) -> None:
    assert parse_quantity(resource, format_quantity(resource, units)) == units


@given(
    resource=st.sampled_from(["memory", "vcore", "cpu", "nvidia.com/gpu"]),
    units=st.integers(min_value=0, max_value=MAX_QUANTITY)
    | st.builds(
        lambda base, power, k: min(MAX_QUANTITY, k * base**power),
        st.sampled_from([2, 10]),
        st.integers(min_value=0, max_value=62),
        st.integers(min_value=1, max_value=1000),
    ),
)
def test_format_then_parse_round_trips_for_any_value(resource: str, units: int) -> None:
    assert parse_quantity(resource, format_quantity(resource, units)) == units


@given(
    whole=st.integers(min_value=0, max_value=10**6),
    frac=st.text(alphabet="0123456789", max_size=12),
    suffix=st.sampled_from(["", "n", "u", "m", "k", "M", "G", "Ki", "Mi", "Gi", "e3", "e-3", "E+2"]),
)
def test_parse_is_ceil_of_exact_value(whole: int, frac: str, suffix: str) -> None:
    from fractions import Fraction
    from math import ceil

    text = f"{whole}.{frac}{suffix}" if frac else f"{whole}{suffix}"
    exact = parse_fraction(text)
    assert exact >= 0
    assert parse_quantity("memory", text) == ceil(exact)
    assert parse_quantity("vcore", text) == ceil(exact * 1000)
    assert exact == Fraction(f"{whole}.{frac or 0}") * parse_fraction(f"1{suffix}")


def test_a_request_refuses_a_fraction_of_a_whole_unit_that_a_limit_rounds_up() -> None:
    with pytest.raises(InvalidQuantity, match="whole units"):
        parse_resources({"fpga": "1.5"}, exact=True)
    with pytest.raises(InvalidQuantity, match="whole milli-cores"):
        parse_resources({"vcore": "0.0001"}, exact=True)
    assert parse_resources({"fpga": "1.5"}) == {"fpga": 2}  # a limit, as YuniKorn reads it
    assert parse_resources({"vcore": "1.5", "memory": "1.5Gi"}, exact=True) == {
        "memory": 3 * 2**29,
        "vcore": 1500,
    }
