"""The text form of an array the driver sends for a ledger function's array parameters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quota_ledger.driver.pg_cursor import array_text, with_text_arrays


def _parse(text: str) -> list[str | None]:
    """A reader of PostgreSQL's array text form for one dimension of quoted strings and NULL."""
    assert text.startswith("{")
    assert text.endswith("}")
    body, values, i = text[1:-1], [], 0
    while i < len(body):
        if body.startswith("NULL", i):
            values.append(None)
            i += 4
        else:
            assert body[i] == '"'
            i += 1
            chars = []
            while body[i] != '"':
                if body[i] == "\\":
                    i += 1
                chars.append(body[i])
                i += 1
            values.append("".join(chars))
            i += 1
        if i < len(body):
            assert body[i] == ","
            i += 1
    return values


@given(st.lists(st.none() | st.text()))
def test_strings_and_null_read_back(values: list[str | None]) -> None:
    assert _parse(array_text(values)) == values


def test_forms() -> None:
    assert array_text([]) == "{}"
    assert array_text([1, -2, 3]) == "{1,-2,3}"
    assert array_text(['a"b', "c\\d", None, "NULL", ""]) == '{"a\\"b","c\\\\d",NULL,"NULL",""}'
    assert with_text_arrays({"a": ["x"], "b": 1, "c": None, "d": ("y",)}) == {
        "a": '{"x"}',
        "b": 1,
        "c": None,
        "d": '{"y"}',
    }


def test_other_values_are_refused() -> None:
    with pytest.raises(TypeError):
        array_text([True])
    with pytest.raises(TypeError):
        array_text([1.5])  # type: ignore[list-item]
