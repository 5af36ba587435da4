"""A layered mapping reads as the plain mapping it stands for, and leaves older ones unchanged."""

from __future__ import annotations

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
