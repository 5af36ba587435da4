"""Strict lines: whether a request may pass the waiting requests ahead of it.

A waiting request waits in the line of every limit that stopped it when it was last tried (its
``blocked`` violations). A line's policy is the ``queueing.policy`` of the queue that holds the
limit (for a ResourceQuota, of the waiting request's own queue). Under ``BestEffortFIFO`` a later
request that fits passes; under ``StrictFIFO`` it may not pass a waiting request ahead of it in a
line it shares: it asks for that line's resource at that limit (the limit's queue is its own or
an ancestor of it; a user's or group's limit, for that user or a member of that group; a
ResourceQuota, in the same queue). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quota_ledger.model import queues
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.values import Violation


@dataclass(frozen=True, kw_only=True, slots=True)
class Ahead:
    """A waiting request ahead of the one being decided."""

    queue: str
    #: resource -> amount it asks for
    needs: Mapping[str, int]
    #: the limits that stopped it when it was last tried
    blocked: tuple[Violation, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Asker:
    """The request being decided: who asks, where, for what."""

    queue: str
    resources: Mapping[str, int]
    user: str | None = None
    groups: tuple[str, ...] = ()
    application: str | None = None

    def asks(self, resource: str) -> int:
        if resource == APPLICATIONS:
            return 1 if self.application is not None else 0
        return self.resources.get(resource, 0)


def behind(asker: Asker, ahead: Sequence[Ahead], strict: Callable[[str], bool]) -> list[Violation]:
    """The strict lines ``asker`` shares with the waiting requests ``ahead`` of it: for each, the
    limit as the first of them saw it, ``requested`` being what they and ``asker`` ask for there
    together. Empty: it may pass them all."""
    found: dict[tuple[str, str, str | None, str], Violation] = {}
    for waiting in ahead:
        for violation in waiting.blocked:
            line_queue = waiting.queue if violation.kind == "quota" else violation.scope
            if not strict(line_queue) or not _shares(violation, waiting.queue, asker):
                continue
            key = (violation.kind, violation.scope, violation.name, violation.resource)
            prior = found.get(key)
            needs = waiting.needs.get(violation.resource, 1 if violation.resource == APPLICATIONS else 0)
            asked = (prior.requested if prior is not None else asker.asks(violation.resource)) + needs
            found[key] = dataclasses.replace(prior or violation, requested=asked)
    return list(found.values())


def _shares(violation: Violation, waiting_queue: str, asker: Asker) -> bool:
    """Whether ``asker`` asks for what ``violation``'s limit counts."""
    if asker.asks(violation.resource) <= 0:
        return False
    if violation.kind == "quota":
        return asker.queue == waiting_queue
    if not queues.in_subtree(asker.queue, violation.scope):
        return False
    if violation.kind == "user":
        return violation.name == asker.user
    if violation.kind == "group":
        return violation.name in asker.groups
    return True


def to_json(violations: Sequence[Violation]) -> list[dict[str, Any]]:
    """``violations`` as stored in a waiting row's ``blocked_by``."""
    return [dataclasses.asdict(v) for v in violations]


def from_json(stored: Sequence[Mapping[str, Any]]) -> tuple[Violation, ...]:
    """The violations a waiting row's ``blocked_by`` holds."""
    return tuple(Violation(**dict(each)) for each in stored)
