"""The usage counters: a locked row of ``quota_usages`` or ``quota_identity_usages``, as the
rule (:mod:`quota_ledger.model.charges`) sees it."""

from __future__ import annotations

from dataclasses import dataclass

#: usage charged to exactly one queue; never carries a limit
QUEUE = "queue"
#: usage of a queue and all its descendants; exists only where a limit is set
SUBTREE = "subtree"
#: a Kubernetes ResourceQuota's usage in one queue (``quota_identity_usages.kind``)
QUOTA = "quota"


@dataclass(frozen=True, slots=True)
class Counter:
    """A snapshot of one ``quota_usages`` row, read under its row lock."""

    id: int
    scope_type: str
    scope: str
    resource: str
    in_use: int
    reserved: int
    limit: int | None
    #: the user or group of a ``user``/``group`` counter (``quota_identity_usages``)
    name: str | None = None
