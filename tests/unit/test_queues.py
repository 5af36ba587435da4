"""Queue paths and partition names: validation, lineage and the subtree range a limit sums."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.queues import (
    MAX_PATH_LENGTH,
    ROOT,
    in_subtree,
    lineage,
    subtree_bounds,
    validate_partition,
    validate_queue,
)

# -- validate_queue -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "queue",
    [
        "root",
        "root.a",
        "root.a.b.c",
        "root.project-a",
        "root.team_1.user@example",
        "root.a:b#c/d@e-f_g",
        "root.ROOT",
        "root.root",
        "root." + "x" * 64,
        "root.0",
    ],
)
def test_valid_queue_paths_accepted(queue: str) -> None:
    assert validate_queue(queue) == queue


@pytest.mark.parametrize(
    "queue",
    ["a", "a.b", "Root", "Root.a", "rootx", "rootx.a", " root", "root ", ".root", "", "queue.root"],
)
def test_queue_path_must_start_with_root(queue: str) -> None:
    with pytest.raises(InvalidRequest, match="root") as info:
        validate_queue(queue)
    assert info.value.field == "queue"


@pytest.mark.parametrize(
    "queue",
    [
        "root.",
        "root..a",
        "root.a.",
        "root.a b",
        "root.a%b",
        "root.a*",
        "root.é",
        "root.a\n",
        "root.a,b",
        "root.a=b",
        "root." + "x" * 65,
        "root.a." + "y" * 65,
    ],
)
def test_queue_segments_follow_yunikorn_rule(queue: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_queue(queue)
    assert info.value.field == "queue"


def _path_of_length(length: int) -> str:
    segments = [ROOT]
    while len(".".join(segments)) < length:
        remaining = length - len(".".join(segments)) - 1
        segments.append("s" * max(1, min(64, remaining)))
    path = ".".join(segments)
    assert len(path) == length
    return path


def test_queue_path_length_limit_is_inclusive() -> None:
    longest = _path_of_length(MAX_PATH_LENGTH)
    assert validate_queue(longest) == longest
    with pytest.raises(InvalidRequest) as info:
        validate_queue(_path_of_length(MAX_PATH_LENGTH + 1))
    assert info.value.field == "queue"


@pytest.mark.parametrize("queue", [None, 1, b"root", ["root"], ("root",)])
def test_queue_path_must_be_a_string(queue: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_queue(queue)
    assert info.value.field == "queue"


# -- validate_partition ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "p-1", "gpu_pool", "a:b#c/d@e", "x" * 64, "0"])
def test_valid_partition_names_accepted(name: str) -> None:
    assert validate_partition(name) == name


@pytest.mark.parametrize("name", ["", "x" * 65, "a.b", "a b", "é", "a\n", None, 7, b"default"])
def test_invalid_partition_names_refused(name: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_partition(name)
    assert info.value.field == "partition"


# -- lineage --------------------------------------------------------------------------------------


def test_lineage_of_root_is_root() -> None:
    assert lineage("root") == ["root"]


def test_lineage_lists_ancestors_root_first() -> None:
    assert lineage("root.a.b") == ["root", "root.a", "root.a.b"]
    assert lineage("root.a/b.c") == ["root", "root.a/b", "root.a/b.c"]


@given(st.lists(st.sampled_from(["a", "b", "a-b", "x/y", "@"]), max_size=5))
def test_lineage_is_prefix_chain(segments: list[str]) -> None:
    queue = ".".join([ROOT, *segments])
    chain = lineage(queue)
    assert chain[0] == ROOT
    assert chain[-1] == queue
    assert len(chain) == len(segments) + 1
    for parent, child in pairwise(chain):
        assert child.startswith(parent + ".")
        assert in_subtree(child, parent)


# -- subtree range --------------------------------------------------------------------------------


def test_in_subtree_includes_self_and_descendants() -> None:
    assert in_subtree("root.a", "root.a")
    assert in_subtree("root.a.b", "root.a")
    assert in_subtree("root.a.b.c", "root.a")
    assert in_subtree("root.a", "root")


def test_in_subtree_does_not_confuse_name_prefixes() -> None:
    assert not in_subtree("root.ab", "root.a")
    assert not in_subtree("root.a-b", "root.a")
    assert not in_subtree("root.a/b", "root.a")
    assert not in_subtree("root.a#b.c", "root.a")
    assert not in_subtree("root", "root.a")
    assert not in_subtree("root.b", "root.a")
    assert not in_subtree("rootx", "root")


def test_subtree_bounds_hold_descendants_only() -> None:
    lo, hi = subtree_bounds("root.a")

    def inside(candidate: str) -> bool:
        return lo <= candidate < hi

    assert inside("root.a.b")
    assert inside("root.a.b.c")
    assert inside("root.a.-")
    assert not inside("root.a")  # strict descendants only: the queue itself is matched separately
    assert not inside("root.ab")
    assert not inside("root.a-b")
    assert not inside("root.a/b")
    assert not inside("root.a#b")
    assert not inside("root.a@b")
    assert not inside("root.a:b")
    assert not inside("root.a_b")
    assert not inside("root.b")
    assert not inside("root")


# every character a segment may hold, and the "." between segments
_SEGMENT_CHARS = "aAz09_:#/@-"
_segment = st.text(alphabet=_SEGMENT_CHARS, min_size=1, max_size=4)
_queue = st.lists(_segment, max_size=4).map(lambda parts: ".".join([ROOT, *parts]))


@given(queue=_queue, candidate=_queue)
def test_subtree_bounds_agree_with_in_subtree(queue: str, candidate: str) -> None:
    lo, hi = subtree_bounds(queue)
    # Python compares str by code point: the same order as a binary collation for ASCII.
    in_range = lo <= candidate < hi
    assert in_range == (in_subtree(candidate, queue) and candidate != queue)


@given(queue=_queue, suffix=st.lists(_segment, min_size=1, max_size=3))
def test_every_descendant_is_in_range(queue: str, suffix: list[str]) -> None:
    descendant = ".".join([queue, *suffix])
    lo, hi = subtree_bounds(queue)
    assert lo <= descendant < hi
    assert in_subtree(descendant, queue)
    assert queue in lineage(descendant)
