"""What the ledger's tables hold for one partition, on any backend, without what names the
partition, the row or the moment (ids, request hashes, clock readings): two partitions that
were asked the same requests in the same order hold the same rows, and a test can read off
what a decision left."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import create_engine, select
from sqlalchemy.engine import URL

from quota_ledger.driver.dialect import normalize_url
from quota_ledger.driver.schema import (
    quota_applications,
    quota_identity_usages,
    quota_journal,
    quota_usages,
    reservation_items,
    reservations,
)

Rows = dict[str, list[tuple[Any, ...]]]


def _json(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def _sorted(found: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(found, key=repr)  # rows may hold None beside text


def partition_rows(url: URL, partition: str) -> Rows:
    """Every reservation (with its ttl and items), journal entry, queue, subtree, user, group
    and ResourceQuota counter and application row of ``partition``, each table sorted. An
    application's area is given by its resources only: its values are the clock's."""
    r, i, j = reservations.c, reservation_items.c, quota_journal.c
    u, d, a = quota_usages.c, quota_identity_usages.c, quota_applications.c
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            made = conn.execute(
                select(
                    r.key,
                    r.state,
                    r.queue,
                    r.user_name,
                    r.groups,
                    r.application,
                    r.priority_class,
                    r.kube,
                    r.resolved_at,
                    r.released_at,
                    r.expires_at,
                    r.created_at,
                ).where(r.partition == partition)
            ).all()
            items = conn.execute(
                select(r.key, r.queue, r.state, i.resource, i.amount, i.committed)
                .join_from(reservation_items, reservations, r.id == i.reservation_id)
                .where(r.partition == partition)
            ).all()
            journal = conn.execute(
                select(j.queue, j.resource, j.delta, j.kind, r.key, r.queue)
                .join_from(quota_journal, reservations, r.id == j.reservation_id, isouter=True)
                .where(j.partition == partition)
            ).all()
            counters = conn.execute(
                select(u.scope_type, u.scope, u.resource, u.in_use, u.reserved, u.hard_limit).where(
                    u.partition == partition
                )
            ).all()
            identities = conn.execute(
                select(d.kind, d.name, d.queue, d.resource, d.in_use, d.reserved, d.hard_limit).where(
                    d.partition == partition
                )
            ).all()
            apps = conn.execute(
                select(
                    a.app_key,
                    a.application,
                    a.user_name,
                    a.queue,
                    a.group_name,
                    a.state,
                    a.pending,
                    a.usage,
                    a.area,
                    a.started_at,
                    a.finished_at,
                ).where(a.partition == partition)
            ).all()
    finally:
        engine.dispose()
    return {
        "reservations": _sorted(
            [
                (
                    *row[:4],
                    _json(row[4]),  # groups
                    row[5],
                    row[6],
                    _json(row[7]),  # kube
                    row[8] is not None,  # resolved
                    row[9] is not None,  # released
                    round((row[10] - row[11]).total_seconds(), 3),  # the ttl
                )
                for row in made
            ]
        ),
        "items": _sorted([tuple(row) for row in items]),
        "journal": _sorted([tuple(row) for row in journal]),
        "counters": _sorted([tuple(row) for row in counters]),
        "identities": _sorted([tuple(row) for row in identities]),
        "apps": _sorted(
            [
                (
                    *row[:7],
                    _json(row[7]),
                    sorted(_json(row[8])),
                    row[9] is not None,
                    row[10] is not None,
                )
                for row in apps
            ]
        ),
    }


def without_areas(found: Rows) -> Rows:
    """The rows but for the applications' areas: committed one by one, what a first commit put
    in use accrues area until the next; committed together, at one instant, it does not."""
    return {**found, "apps": [(*row[:8], *row[9:]) for row in found["apps"]]}


def counters_of(found: Rows) -> dict[tuple[str, str, str], tuple[int, int, int | None]]:
    """The queue and subtree counters of :func:`partition_rows`: (in use, reserved, limit)."""
    return {
        (kind, scope, res): (in_use, reserved, limit)
        for kind, scope, res, in_use, reserved, limit in found["counters"]
    }


def identities_of(found: Rows) -> dict[tuple[str, str, str, str], tuple[int, int, int]]:
    """The user, group and ResourceQuota counters of :func:`partition_rows`."""
    return {tuple(row[:4]): tuple(row[4:]) for row in found["identities"]}  # type: ignore[misc]


def apps_of(found: Rows) -> dict[str, tuple[Any, ...]]:
    """The application rows of :func:`partition_rows` by key: (application, user, queue, group,
    state, pending, usage, area's resources, started, finished)."""
    return {row[0]: row[1:] for row in found["apps"]}
