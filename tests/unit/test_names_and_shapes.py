"""The one validation module: names, documents and bounds (pure, no database)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import yaml

from quota_ledger.model import validation
from quota_ledger.model.errors import InvalidRequest, TooManyResources


@pytest.mark.parametrize("bad", ["", "a\x00", "\ud800", "a\x1bb", "x" * 256, 5, None, b"a", ["a"]])
def test_names_are_printable_strings_of_1_to_255_characters(bad: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        validation.name(bad, "user")
    assert info.value.field == "user"
    assert validation.name("alice@example.com", "user") == "alice@example.com"


def test_error_messages_never_carry_unencodable_or_huge_text() -> None:
    for bad in ("\ud800", "x" * 100_000):
        with pytest.raises(InvalidRequest) as info:
            validation.name(bad, "key")
        str(info.value).encode("utf-8")
        assert len(str(info.value)) < 200


def test_names_lists_accept_none_as_empty_and_refuse_other_shapes() -> None:
    assert validation.names(None, "groups") == ()
    assert validation.names(("a", "b"), "groups") == ("a", "b")
    for bad in (5, "ab", [None], [1], {"a": 1}, ["g"] * 257):
        with pytest.raises(InvalidRequest) as info:
            validation.names(bad, "groups")
        assert info.value.field == "groups"


def test_kubernetes_names_follow_the_api_server() -> None:
    assert validation.namespace("a" * 63) == "a" * 63
    assert validation.subdomain("a." * 126 + "a", "name") == "a." * 126 + "a"
    for bad in ("a" * 64, "A", "a.b", "-a", "a-", "x y'; --", "", "a\x00"):
        with pytest.raises(InvalidRequest):
            validation.namespace(bad)
    for bad in ("a" * 254, "a_b", "a..b", ".a", "High", ""):
        with pytest.raises(InvalidRequest):
            validation.subdomain(bad, "name")
    assert validation.priority_class(None) is None


def test_partitions_and_queues_follow_yunikorn() -> None:
    assert validation.partition("gpu-pool_1") == "gpu-pool_1"
    assert validation.optional_partition(None) is None
    for bad in ("", "a b", "a\x01", "ä", "a" * 65, "'; --", None):
        with pytest.raises(InvalidRequest):
            validation.partition(bad)
    with pytest.raises(InvalidRequest):
        validation.optional_partition("")
    for bad in ("root.", "x.a", "root..a", "root.a b", "root." + "a" * 300):
        with pytest.raises(InvalidRequest):
            validation.queue(bad)


def test_ttls() -> None:
    assert validation.ttl(timedelta(minutes=1)) == 60.0
    assert validation.ttl(5) == 5.0
    for bad in (True, 0, -(10**400), 10**400, float("nan"), "5", None):
        with pytest.raises(InvalidRequest) as info:
            validation.ttl(bad)
        assert info.value.field == "ttl"


def test_documents_are_bounded_in_depth_and_free_of_nul_and_surrogates() -> None:
    deep: Any = "x"
    for _ in range(100_000):
        deep = [deep]
    assert "deeper than" in (validation.document_problem(deep) or "")
    assert validation.document_problem({"a": [{"b": "ok"}]}) is None
    with pytest.raises(InvalidRequest) as info:
        validation.document({"spec": {"name": "a\x00"}}, "pod")
    assert info.value.field == "spec.name"
    with pytest.raises(InvalidRequest):
        validation.document({"k\ud800": 1}, "pod")


def test_yaml_nesting_and_alias_bombs_are_measured_before_building(monkeypatch: pytest.MonkeyPatch) -> None:
    # The work done is counted rather than timed: the events each parser gave, and no object built.
    parse = yaml.parse
    read: list[int] = []

    def counted(stream: Any, Loader: Any) -> Iterator[yaml.Event]:  # noqa: N803 - PyYAML's name
        read.append(0)
        for event in parse(stream, Loader=Loader):
            read[-1] += 1
            yield event

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a document was built while it was measured")

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = "\n".join(lines)  # 10**9 values once its aliases are expanded
    in_bomb = sum(1 for _ in parse(bomb, Loader=yaml.SafeLoader))
    with monkeypatch.context() as patched:
        patched.setattr(yaml, "parse", counted)
        patched.setattr(yaml.constructor.BaseConstructor, "construct_document", refused)
        assert "deeper than" in (validation.yaml_problem("a: " + "[" * 100_000) or "")
        # Each parser tried stops a few events past the depth limit, not 100 000 levels down.
        assert 0 < max(read, default=0) <= validation.MAX_DEPTH + 8, read
        read.clear()
        assert "values" in (validation.yaml_problem(bomb) or "")
        # Counted by its anchors: no more events than the text holds, none of its expansion.
        assert 0 < sum(read) <= in_bomb, (read, in_bomb)
    assert validation.yaml_problem("a: &x [1, 2]\nb: *x\n") is None
    assert validation.load_yaml("a: [1, {b: 2}]", "f") == {"a": [1, {"b": 2}]}
    with pytest.raises(InvalidRequest):
        validation.load_yaml('a: "x\\0y"', "f")


class _RefusesDeepFlow(yaml.SafeLoader):
    """A parser that refuses deep flow collections while scanning, before giving their events
    (as libyaml does from PyYAML 6.0.4, at about a thousand levels)."""

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 - PyYAML's name
        if self.flow_level >= 100:
            raise yaml.scanner.ScannerError(None, None, "exceeded maximum nesting depth", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)


def test_yaml_nesting_is_measured_when_the_fast_parser_refuses_it_while_scanning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(validation, "_EVENTS", _RefusesDeepFlow)
    assert "deeper than" in (validation.yaml_problem("a: " + "[" * 10_000) or "")
    assert validation.yaml_problem("a: [1, [2, [3]]]") is None
    assert validation.yaml_problem("a: [1, 2") is None  # a syntax error: the real load reports it
    with pytest.raises(InvalidRequest, match="deeper than"):
        validation.load_yaml("a: " + "[" * 10_000, "f")


def test_bounds_count_resources() -> None:
    bounds = validation.Bounds(resources_per_request=2, resources_per_limit_set=1, resources_per_partition=3)
    bounds.request({"a": 1, "b": 1})
    with pytest.raises(TooManyResources) as info:
        bounds.request({"a": 1, "b": 1, "c": 1})
    assert (info.value.where, info.value.count, info.value.maximum) == ("request", 3, 2)
    with pytest.raises(TooManyResources):
        bounds.limit_set({"a": 1, "b": 1})
    with pytest.raises(TooManyResources):
        bounds.partition({"a", "b", "c", "d"}, "default")
    with pytest.raises(InvalidRequest):
        validation.Bounds(resources_per_request=0)
