"""Queue paths and partition names: validation and the lineage a limit check walks."""

from __future__ import annotations

import re

from quota_ledger.errors import InvalidRequest

ROOT = "root"
MAX_PATH_LENGTH = 255
# YuniKorn's queue name rule (one segment of a path).
_SEGMENT = re.compile(r"[a-zA-Z0-9_:#/@-]{1,64}", re.ASCII)


def validate_partition(partition: object) -> str:
    """Return ``partition`` if it is a valid partition name."""
    if not isinstance(partition, str) or not _SEGMENT.fullmatch(partition):
        raise InvalidRequest(
            f"invalid partition name {partition!r}: 1-64 of a-z A-Z 0-9 _ : # / @ -",
            field="partition",
        )
    return partition


def validate_queue(queue: object) -> str:
    """Return ``queue`` if it is a fully qualified queue path such as ``root.a.b``."""
    if not isinstance(queue, str) or len(queue) > MAX_PATH_LENGTH:
        raise InvalidRequest(f"invalid queue path {queue!r}", field="queue")
    segments = queue.split(".")
    if segments[0] != ROOT:
        raise InvalidRequest(
            f"invalid queue path {queue!r}: it must start with {ROOT!r} (e.g. root.project-a)",
            field="queue",
        )
    for segment in segments:
        if not _SEGMENT.fullmatch(segment):
            raise InvalidRequest(
                f"invalid queue path {queue!r}: segment {segment!r} must be 1-64 of a-z A-Z 0-9 _ : # / @ -",
                field="queue",
            )
    return queue


def lineage(queue: str) -> list[str]:
    """The queue and all its ancestors, root first: ``root.a.b`` -> root, root.a, root.a.b."""
    segments = queue.split(".")
    return [".".join(segments[: i + 1]) for i in range(len(segments))]


def subtree_bounds(queue: str) -> tuple[str, str]:
    """A half-open string range holding exactly the strict descendants of ``queue``.

    Descendants are ``queue + "." + ...``; "/" is the character after "." so
    ``[queue + ".", queue + "/")`` holds them and nothing else under a binary collation.
    """
    return queue + ".", queue + "/"


def in_subtree(candidate: str, queue: str) -> bool:
    """Whether ``candidate`` is ``queue`` or one of its descendants."""
    return candidate == queue or candidate.startswith(queue + ".")
