"""A reservation request, checked and ready to be decided, and who it is charged to.

Pure values: the engine builds a :class:`ReserveRequest` from the caller's arguments
(:func:`build`); the ledger decides it, and on PostgreSQL the driver turns it into a server
function's arguments.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from quota_ledger.model import arguments, validation
from quota_ledger.model.values import Reservation, ReservationState

Missing = Mapping[str, Mapping[str, list[str]]]


@dataclass(frozen=True, kw_only=True)
class ReserveRequest:
    """A checked reservation request (the engine validates the arguments it is built from)."""

    reservation_id: str
    partition: str
    queue: str
    #: resource -> amount, every amount positive
    resources: dict[str, int]
    user: str | None
    groups: tuple[str, ...]
    application: str | None
    priority_class: str | None
    key: str | None
    request_hash: str
    ttl_seconds: float
    #: ``{"usage": ..., "scopes": ...}``: what ResourceQuotas count and match on
    kube: dict[str, Any]
    namespace: str
    #: for a pod: containers that set no request or limit, per kind and resource
    missing: Missing | None = None
    #: the queue and resources were named by hand (a pod's come from its manifest): a partition
    #: with ``unknownnames: refuse`` refuses those its configuration does not know
    checks_names: bool = False
    #: how it waits in line when it does not fit: higher is granted first
    priority: int = 0
    #: it is a waiting request's grant: its row is in the line already (state ``waiting``)
    granting: bool = False
    #: when a waiting request joined its line (its grant's place in line)
    queued_at: datetime | None = None

    def pending(self, now: datetime) -> Reservation:
        """The reservation as stored, created at ``now`` (the database clock)."""
        return Reservation(
            id=self.reservation_id,
            state=ReservationState.PENDING,
            partition=self.partition,
            queue=self.queue,
            resources=self.resources,
            created_at=now.replace(tzinfo=UTC),
            expires_at=(now + timedelta(seconds=self.ttl_seconds)).replace(tzinfo=UTC),
            key=self.key,
            user=self.user,
            groups=self.groups,
            application=self.application,
            priority_class=self.priority_class,
            priority=self.priority,
        )


def build(
    *,
    partition: str,
    queue: str,
    resources: dict[str, int],
    user: str | None,
    groups: Iterable[str] | None,
    application: str | None,
    ttl: float | timedelta | None,
    default_ttl: float,
    key: str | None,
    kube: dict[str, Any],
    namespace: str,
    missing: Missing | None = None,
    checks_names: bool = False,
) -> ReserveRequest:
    """A request from the caller's arguments, its names checked (``resources`` and ``kube``
    are already parsed), with a new reservation id and the hash a repeat must match."""
    group_list = validation.names(groups, "groups")
    who = {
        "user": validation.optional_name(user, "user"),
        "application": validation.optional_name(application, "application"),
        "priority_class": kube["scopes"]["priorityClass"],
    }
    key = validation.optional_name(key, "key")
    ttl_seconds = default_ttl if ttl is None else validation.ttl(ttl)
    scopes = {k: v for k, v in kube["scopes"].items() if k != "priorityClass" and v}
    return ReserveRequest(
        reservation_id=str(uuid.uuid4()),
        partition=partition,
        queue=queue,
        resources=resources,
        user=who["user"],
        groups=group_list,
        application=who["application"],
        priority_class=who["priority_class"],
        key=key,
        request_hash=arguments.request_hash(partition, queue, resources, group_list, {**who, **scopes}),
        ttl_seconds=ttl_seconds,
        kube=kube,
        namespace=namespace,
        missing=missing,
        checks_names=checks_names,
    )


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is for, and what tracking it costs under a compiled configuration."""

    user: str | None = None
    groups: tuple[str, ...] = ()
    application: str | None = None
    #: the application row (None: untracked), and the group it must be tracked against
    app_key: str | None = None
    group: str | None = None
    #: (kind, name, queue, resource, amount, limit) for every user/group counter that enforces
    #: it; its ``applications`` counters count only when the request starts the application
    counters: tuple[tuple[str, str, str, str, int, int], ...] = field(default=())
