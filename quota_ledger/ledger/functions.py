"""Plain reservations on PostgreSQL: one server-side function call per reserve, commit or
expiry batch (see :mod:`quota_ledger.driver.pg_functions` and migration 0004).

The function path covers the steady state: a request that asks for something, on counters
that exist, and, when it names a user or an application, for an application that is already
running. Which ResourceQuotas it is charged to (and whether admission lets it in), its group
and the user/group counters that enforce it are decided here from the configuration the
engine last compiled; the function checks under the partition lock that this configuration is
still the one in force, and that the application row is as expected. Otherwise these helpers
return None and the engine runs its general path, so the outcome is the same either way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from quota_ledger.config.rules import Rules
from quota_ledger.driver import dialect, pg_functions
from quota_ledger.driver.core import DbQuotaDriver
from quota_ledger.ledger import applications, resource_quotas
from quota_ledger.model import tracking
from quota_ledger.model.errors import MissingCoveringQuota, PodMissingResources
from quota_ledger.model.values import Reservation, ReservationState


def quota_charges(
    rules: Rules,
    partition: str,
    queue: str,
    namespace: str,
    kube: Mapping[str, Any],
    missing: Mapping[str, Mapping[str, list[str]]] | None,
) -> list[tuple[str, str, int]] | None:
    """The (quota, resource, amount) charges of a request under ``rules``, or None when the
    admission rules refuse it: the general path then decides again under the partition lock
    (these ``rules`` may be out of date) and raises the refusal."""
    try:
        quotas = resource_quotas.admit(rules.partition(partition), queue, namespace, kube, missing)
    except (MissingCoveringQuota, PodMissingResources):
        return None
    usage: Mapping[str, int] = kube["usage"]
    return [(key, name, usage[name]) for key, name in sorted(resource_quotas.charged_keys(quotas, usage))]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is for, and what tracking it costs under a compiled configuration."""

    user: str | None = None
    groups: tuple[str, ...] = ()
    application: str | None = None
    #: the application row (None: untracked), and the group it must be tracked against
    app_key: str | None = None
    group: str | None = None
    #: (kind, name, queue, resource, amount) for every user/group counter that enforces it
    counters: tuple[tuple[str, str, str, str, int], ...] = ()


def identity_of(
    rules: Rules,
    partition: str,
    queue: str,
    resources: Mapping[str, int],
    *,
    user: str | None,
    groups: tuple[str, ...],
    application: str | None,
) -> Identity:
    """The application row and user/group counters a request is charged to, as the general
    path would find them for an application that is already running."""
    if user is None and application is None:
        return Identity(groups=groups)
    found = rules.partition(partition)
    group = applications.group_for(found, queue, user, groups)
    needed = applications.identity_keys(found, queue, user, group, resources)
    return Identity(
        user=user,
        groups=groups,
        application=application,
        app_key=tracking.app_key(application, user, queue),
        group=group,
        counters=tuple((*key, resources[key[3]]) for key in sorted(needed)),
    )


def reserve(
    driver: DbQuotaDriver,
    rules: Rules,
    reservation_id: str,
    *,
    partition: str,
    queue: str,
    resources: dict[str, int],
    key: str | None,
    request_hash: str,
    ttl_seconds: float,
    priority_class: str | None,
    kube: dict[str, Any],
    charges: Sequence[tuple[str, str, int]] = (),
    identity: Identity = Identity(),
) -> datetime | None:
    """Reserve in one call, charging the ResourceQuota counters ``charges`` names and the
    application and user/group counters of ``identity``; the database clock it was created
    at, or None when the function declined (nothing was written)."""
    names = sorted(resources)
    counters = identity.counters
    ttl = timedelta(seconds=ttl_seconds)
    rows = driver.call(
        pg_functions.RESERVE,
        {
            "id": reservation_id,
            "partition": partition,
            "key": key,
            "request_hash": request_hash,
            "queue": queue,
            "resources": names,
            "amounts": [resources[name] for name in names],
            "ttl_us": ttl // timedelta(microseconds=1),
            "priority_class": priority_class,
            "kube": json.dumps(kube, sort_keys=True, separators=(",", ":")),
            "version": rules.version,
            "ns": dialect.ADVISORY_NAMESPACE,
            "k": dialect.advisory_key(partition),
            "quota_names": [key for key, _, _ in charges],
            "quota_resources": [name for _, name, _ in charges],
            "quota_amounts": [amount for _, _, amount in charges],
            "user": identity.user,
            "groups": json.dumps(list(identity.groups)) if identity.groups else None,
            "application": identity.application,
            "app_key": identity.app_key,
            "group": identity.group,
            "id_kinds": [c[0] for c in counters],
            "id_names": [c[1] for c in counters],
            "id_queues": [c[2] for c in counters],
            "id_resources": [c[3] for c in counters],
            "id_amounts": [c[4] for c in counters],
        },
    )
    if rows is None:
        return None
    now: datetime = rows[0][0]
    return now


def commit(driver: DbQuotaDriver, reservation_id: str, operation_id: str) -> Reservation | None:
    """Commit a pending reservation whole in one call; None when the function declined (not
    found, not pending, past its expiry, no application row: the general path says which)."""
    rows = driver.call(pg_functions.COMMIT, {"id": reservation_id, "op": operation_id})
    if not rows:
        return None
    row = rows[0]
    resources = dict(zip(row.resources, row.amounts, strict=True))
    return Reservation(
        id=reservation_id,
        state=ReservationState.COMMITTED,
        partition=row.partition,
        queue=row.queue,
        resources=resources,
        created_at=row.created_at.replace(tzinfo=UTC),
        expires_at=row.expires_at.replace(tzinfo=UTC),
        key=row.key,
        user=row.user_name,
        groups=tuple(json.loads(row.groups)) if row.groups else (),
        application=row.application,
        priority_class=row.priority_class,
        committed=dict(resources),
        resolved_at=row.resolved_at.replace(tzinfo=UTC),
    )


def expire_batch(driver: DbQuotaDriver, rules: Rules, partition: str, batch_size: int) -> int | None:
    """Expire up to ``batch_size`` plain reservations in one call; how many, or None when the
    configuration changed since ``rules`` were compiled."""
    rows = driver.call(
        pg_functions.EXPIRE,
        {
            "partition": partition,
            "limit": batch_size,
            "skip": sorted(rules.partition(partition).quotas),
            "version": rules.version,
            "ns": dialect.ADVISORY_NAMESPACE,
            "k": dialect.advisory_key(partition),
        },
    )
    return None if rows is None else int(rows[0][0])
