"""Queue paths and partition names: validation and the lineage a limit check walks."""

from __future__ import annotations

from quota_ledger.model import validation

ROOT = validation.ROOT
MAX_PATH_LENGTH = validation.MAX_PATH_LENGTH


def validate_partition(partition: object) -> str:
    """Return ``partition`` if it is a valid partition name (see :mod:`quota_ledger.model.validation`)."""
    return validation.partition(partition)


def validate_queue(queue: object) -> str:
    """Return ``queue`` if it is a fully qualified queue path such as ``root.a.b``."""
    return validation.queue(queue)


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
