"""A layered mapping (and an appended tuple) reads as the plain value it stands for, and leaves
older ones unchanged."""

from __future__ import annotations

from collections.abc import Sequence

from quota_ledger.config import layered
from quota_ledger.config.layered import Layered, updated


def test_a_layered_mapping_reads_as_its_plain_equivalent_through_many_updates() -> None:
    plain = {f"q{i}": i for i in range(200)}
    mapping = updated(dict(plain), {})
    versions = [(dict(plain), mapping)]
    for step in range(300):
        change = {f"q{step % 250}": -step}
        plain = {**plain, **change}
        mapping = updated(mapping, change)
        versions.append((dict(plain), mapping))
    for expected, got in versions:  # every older version still reads as it did
        assert dict(got) == expected
        assert len(got) == len(expected)
        assert got == expected
        assert got.get("q249") == expected.get("q249")
        assert got.get("missing", "none") == "none"
        assert "q0" in got
        assert "missing" not in got


def test_a_layer_is_folded_into_the_base_once_it_grows() -> None:
    mapping: Layered[str, int] = Layered({str(i): i for i in range(10_000)})
    for i in range(101):
        mapping = mapping.updated({str(i): -i})
    assert len(mapping._layer) < 100  # folded once past sqrt(10,000) = 100
    assert mapping["5"] == -5


def test_appended_items_read_as_the_tuple_of_them_and_leave_the_earlier_ones_alone() -> None:
    items: Sequence[int] = (0, 1)
    versions = [items]
    for value in range(2, 3000):
        items = layered.appended(items, value)
        versions.append(items)
    assert items == tuple(range(3000))
    assert tuple(range(3000)) == items
    assert len(items) == 3000
    assert items[2999] == 2999
    assert items[-1] == 2999
    assert items[1500] == 1500
    assert items[10:13] == (10, 11, 12)
    assert hash(items) == hash(tuple(range(3000)))
    assert versions[100] == tuple(range(102))  # each version keeps its own items
    assert items != tuple(range(2999))
    assert items != "ab"
