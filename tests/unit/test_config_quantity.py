"""YuniKorn's configuration quantities (notes §1.2): digits and a suffix, ``vcore`` alone in milli."""

from __future__ import annotations

from typing import Final

import pytest

from quota_ledger.config import parse_config_quantity, parse_config_resources
from quota_ledger.model.errors import InvalidQuantity, InvalidRequest
from quota_ledger.model.quantity import MAX_QUANTITY

# The table of notes §1.2: (input, key "memory", key "vcore"); a str is the error reason.
TABLE: Final[list[tuple[str, int | str, int | str]]] = [
    ("10", 10, 10_000),
    ("250G", 250_000_000_000, 250_000_000_000_000),
    ("1Gi", 1_073_741_824, 1_073_741_824_000),
    ("100m", "invalid suffix", 100),
    ("10M", 10_000_000, 10_000_000_000),
    ("-1", "invalid quantity", "invalid quantity"),
    ("7E", 7_000_000_000_000_000_000, "overflow"),
    ("1.5G", "invalid quantity", "invalid quantity"),
    ("", "invalid quantity", "invalid quantity"),
    ("x", "invalid quantity", "invalid quantity"),
]


@pytest.mark.parametrize(("text", "memory", "vcore"), TABLE)
def test_the_table_of_the_notes(text: str, memory: int | str, vcore: int | str) -> None:
    for resource, expected in (("memory", memory), ("vcore", vcore)):
        if isinstance(expected, int):
            assert parse_config_quantity(resource, text) == expected
        else:
            with pytest.raises(InvalidQuantity) as caught:
                parse_config_quantity(resource, text)
            assert (caught.value.resource, caught.value.text, caught.value.reason) == (
                resource,
                text,
                expected,
            )


@pytest.mark.parametrize(
    ("suffix", "multiplier"),
    [
        ("", 1),
        ("k", 10**3),
        ("M", 10**6),
        ("G", 10**9),
        ("T", 10**12),
        ("P", 10**15),
        ("E", 10**18),
        ("Ki", 2**10),
        ("Mi", 2**20),
        ("Gi", 2**30),
        ("Ti", 2**40),
        ("Pi", 2**50),
        ("Ei", 2**60),
    ],
)
def test_every_multiplier(suffix: str, multiplier: int) -> None:
    assert parse_config_quantity("memory", f"3{suffix}") == 3 * multiplier
    assert parse_config_quantity("pods", f"3{suffix}") == 3 * multiplier


@pytest.mark.parametrize("text", ["1K", "1ki", "1mi", "1KI"])
def test_capital_k_alone_and_ki_are_invalid_suffixes(text: str) -> None:
    for resource in ("memory", "vcore"):
        with pytest.raises(InvalidQuantity) as caught:
            parse_config_quantity(resource, text)
        assert caught.value.reason == ("invalid quantity" if text == "1KI" else "invalid suffix")


@pytest.mark.parametrize("resource", ["memory", "cpu", "vcores", "nvidia.com/gpu", "mem", "pods"])
def test_only_the_key_vcore_is_milli(resource: str) -> None:
    assert parse_config_quantity(resource, "2") == 2
    with pytest.raises(InvalidQuantity) as caught:
        parse_config_quantity(resource, "500m")
    assert caught.value.reason == "invalid suffix"


def test_vcore_takes_cores_and_millicores() -> None:
    assert parse_config_quantity("vcore", "2") == 2000
    assert parse_config_quantity("vcore", "500m") == 500
    assert parse_config_quantity("vcore", "2k") == 2_000_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [(" 10 ", 10), ("10 Gi", 10 * 2**30), ("10\tk", 10_000), ("007", 7), ("0", 0), ("\n5\n", 5)],
)
def test_trimmed_and_space_before_the_suffix(text: str, expected: int) -> None:
    assert parse_config_quantity("memory", text) == expected


@pytest.mark.parametrize("text", ["+1", "1e3", "0x10", "1_000", "1 0", "Gi", "1.", ".5", "1Gi5", "1 G i"])
def test_anything_but_digits_and_a_suffix_is_invalid(text: str) -> None:
    with pytest.raises(InvalidQuantity) as caught:
        parse_config_quantity("memory", text)
    assert caught.value.reason == "invalid quantity"


def test_the_int64_boundary() -> None:
    assert parse_config_quantity("memory", str(MAX_QUANTITY)) == MAX_QUANTITY
    assert parse_config_quantity("memory", "7Ei") == 7 * 2**60
    assert parse_config_quantity("vcore", "9223372036854775807m") == MAX_QUANTITY
    for resource, text in [
        ("memory", str(MAX_QUANTITY + 1)),
        ("memory", "8Ei"),
        ("memory", "99999999999999999999999"),
        ("vcore", "9223372036854776"),
        ("vcore", "9223372036854775808m"),
    ]:
        with pytest.raises(InvalidQuantity) as caught:
            parse_config_quantity(resource, text)
        assert caught.value.reason == "overflow"


def test_ints_mean_their_decimal_text() -> None:
    assert parse_config_quantity("memory", 10) == 10
    assert parse_config_quantity("vcore", 2) == 2000
    assert parse_config_quantity("memory", MAX_QUANTITY) == MAX_QUANTITY
    with pytest.raises(InvalidQuantity) as caught:
        parse_config_quantity("memory", -1)
    assert (caught.value.text, caught.value.reason) == ("-1", "invalid quantity")
    with pytest.raises(InvalidQuantity) as caught:
        parse_config_quantity("memory", MAX_QUANTITY + 1)
    assert caught.value.reason == "overflow"
    with pytest.raises(InvalidQuantity) as caught:
        parse_config_quantity("memory", 10**5000)  # too long for str(): refused before
    assert caught.value.reason == "overflow"


@pytest.mark.parametrize("value", [1.0, 1.5, True, False, None, [1], {"a": 1}, b"1"])
def test_floats_bools_and_other_types_are_refused(value: object) -> None:
    with pytest.raises(InvalidQuantity) as caught:
        parse_config_quantity("memory", value)
    assert caught.value.reason == "invalid quantity"
    assert caught.value.text == str(value)


def test_resources_are_parsed_and_sorted() -> None:
    assert parse_config_resources({"vcore": "2", "memory": 10, "nvidia.com/gpu": "1"}) == {
        "memory": 10,
        "nvidia.com/gpu": 1,
        "vcore": 2000,
    }
    assert list(parse_config_resources({"vcore": "2", "memory": "1"})) == ["memory", "vcore"]
    assert parse_config_resources({}) == {}


def test_a_bad_resource_name_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        parse_config_resources({"bad name": "1"})
    with pytest.raises(InvalidRequest):
        parse_config_resources({"": "1"})


def test_applications_is_reserved_for_the_ledger() -> None:
    with pytest.raises(InvalidQuantity) as caught:
        parse_config_resources({"memory": "1", "applications": "5"})
    assert (caught.value.resource, caught.value.text, caught.value.reason) == (
        "applications",
        "5",
        "reserved resource name",
    )


def test_a_bad_quantity_names_its_resource() -> None:
    with pytest.raises(InvalidQuantity) as caught:
        parse_config_resources({"memory": "1", "cpu": "100m"})
    assert (caught.value.resource, caught.value.text, caught.value.reason) == (
        "cpu",
        "100m",
        "invalid suffix",
    )
