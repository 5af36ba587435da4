"""The application and user/group part of reserve, resolve, release and expire.

Runs inside the ledger's transactions, between the reservation rows and the queue counters
in the lock order: application rows first, then (after the queue and subtree counters) the
user and group counters.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from quota_ledger.config import identity
from quota_ledger.config.identity import Key
from quota_ledger.config.rules import GROUP, USER, PartitionRules
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.model import tracking
from quota_ledger.model.counters import Counter
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.queues import lineage
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Reservation

summary_log = logging.getLogger("quota_ledger.summary")


def tracked(user: str | None, application: str | None) -> bool:
    return user is not None or application is not None


def key_of(reservation: Reservation) -> str:
    return tracking.app_key(reservation.application, reservation.user, reservation.queue)


def open_app(
    tx: LedgerTx,
    rules: PartitionRules,
    *,
    partition: str,
    queue: str,
    user: str | None,
    groups: Sequence[str],
    application: str | None,
    now: datetime,
) -> AppState:
    """Lock (or start) the application a reservation belongs to; its group is chosen here,
    once per run of the application."""
    key = tracking.app_key(application, user, queue)
    app = tx.lock_apps(partition, [key]).get(key)
    group = group_for(rules, queue, user, groups)
    if app is None:
        return tracking.new_app(partition, application, user, queue, group, now)
    if app.state == tracking.FINISHED:
        # Nothing of a finished application is held: YuniKorn has forgotten it, so its id is
        # free for any user and queue.
        tracking.restart(app, group, now, user=user, queue=queue)
    else:
        check_owner(app, user, queue)
    return app


def group_for(rules: PartitionRules, queue: str, user: str | None, groups: Sequence[str]) -> str | None:
    """The group a new run of a user's application is tracked against (None without a user)."""
    return rules.select_group(queue, list(groups)) if user is not None else None


def identity_limits(
    rules: PartitionRules, queue: str, user: str | None, group: str | None, requested: Iterable[str]
) -> dict[Key, int]:
    """(kind, name, queue, resource) -> limit of every user/group counter that enforces a request."""
    wanted = set(requested)
    return {
        (s.kind, s.name, s.queue, resource): limit
        for s in rules.identity_scopes(queue, user, group)
        for resource, limit in s.rule.counters().items()
        if resource in wanted
    }


def identity_keys(
    rules: PartitionRules, queue: str, user: str | None, group: str | None, requested: Iterable[str]
) -> set[Key]:
    """(kind, name, queue, resource) of every user/group counter that enforces a request."""
    return set(identity_limits(rules, queue, user, group, requested))


def check_owner(app: AppState, user: str | None, queue: str) -> None:
    if app.user != user or app.queue != queue:
        raise InvalidRequest(
            f"application {app.application!r} belongs to user {app.user!r} in queue {app.queue}",
            field="application",
        )


def stop(tx: LedgerTx, app: AppState, now: datetime, how: str) -> bool:
    """Finish a running application; True when it counted as running (a named one)."""
    summary = tracking.finish(app, now, how)
    if summary is not None:
        summarize(tx, [summary], now)
    return summary is not None


def summarize(tx: LedgerTx, summaries: Sequence[Mapping[str, Any]], now: datetime) -> None:
    """Keep the summaries of applications that stopped, and log each once committed."""
    tx.insert_summaries(summaries, now)
    for summary in summaries:
        line = json.dumps(summary, sort_keys=True, separators=(",", ":"))
        tx.after_commit.append(partial(summary_log.info, "QUOTA_APP_SUMMARY: %s", line))


def save(tx: LedgerTx, app: AppState) -> None:
    if app.id is None:
        tx.insert_app(app)
    else:
        tx.update_app(app)


def lock_for_reserve(
    tx: LedgerTx,
    rules: PartitionRules,
    app: AppState,
    requested: Mapping[str, int],
    now: datetime,
) -> list[Counter]:
    """Lock the user/group counters that enforce a reservation, creating the missing ones.

    A user's copy of a wildcard limit is made when it is first needed. It is created here, in
    the reservation's own transaction, so a refusal leaves no trace; the limits come from
    ``rules`` (read under the shared partition lock this transaction holds, so no
    configuration change can slip in between) and the usage from the application rows.
    """
    limits = identity_limits(rules, app.queue, app.user, app.group, requested)
    if not limits:
        return []
    have = lock_identity(tx, app.partition, limits)
    if missing := sorted(limits.keys() - have.keys()):
        _create(tx, app, {key: limits[key] for key in missing}, requested, now)
        have = lock_identity(tx, app.partition, limits)
    return [have[key] for key in sorted(limits)]


def lock_identity(tx: LedgerTx, partition: str, keys: Iterable[Key]) -> dict[Key, Counter]:
    """Lock the user/group counters of ``keys`` that exist, by key."""
    found = tx.lock_identity_keys(partition, keys)
    return {(c.scope_type, c.name or "", c.scope, c.resource): c for c in found}


def _create(
    tx: LedgerTx, app: AppState, limits: Mapping[Key, int], requested: Mapping[str, int], now: datetime
) -> None:
    """Insert counters (skipping any a concurrent transaction created first) holding what the
    application rows held before this reservation: this transaction has already written its
    own application row, and adds its request to the counters once they are locked.

    The rows are locked, so that a release or expiry of another of the user's applications
    (which finds no counter to charge yet) is either in the values or waits for them. That
    lock comes after the counters in the lock order, once per counter's lifetime: a deadlock
    it meets is the database's to detect, and the driver runs the reservation again. A
    concurrent reservation of the same user inserting the same counter waits for ours (or we
    for it): one insert is kept, and each then adds its own request under the counter lock.
    """
    apps = list(tx.lock_apps(app.partition, counted_keys(tx, app.partition, limits)).values())
    rows = {}
    for key, limit in limits.items():
        in_use, reserved = identity.value(apps, key)
        resource = key[3]
        if resource == APPLICATIONS:
            in_use -= requested[APPLICATIONS]
        else:
            reserved -= requested[resource]
        rows[key] = (in_use, reserved, limit)
    tx.insert_identity_counters(app.partition, rows, now)


def counted_keys(tx: LedgerTx, partition: str, keys: Iterable[Key]) -> set[str]:
    """The keys of the application rows that the user/group counters of ``keys`` count: every
    row of those users, and every row tracked against those groups (not locked)."""
    wanted = list(keys)
    users = {name for kind, name, _, _ in wanted if kind == USER}
    groups = {name for kind, name, _, _ in wanted if kind == GROUP}
    return set(tx.app_keys_of_names(partition, users, groups))


def lock_of(tx: LedgerTx, apps: Iterable[AppState], resources: Iterable[str]) -> list[Counter]:
    """Lock every user/group counter that charges these applications, for ``resources``."""
    app_list = list(apps)
    wanted = list(resources)
    keys = {
        (kind, name, scope, resource)
        for a in app_list
        for kind, name in ((USER, a.user), (GROUP, a.group))
        if name is not None
        for scope in lineage(a.queue)
        for resource in wanted
    }
    if not keys:
        return []
    return tx.lock_identity_keys(app_list[0].partition, keys)


def charges(app: AppState, counters: Iterable[Counter]) -> list[Counter]:
    """The counters among ``counters`` that ``app``'s usage is charged to."""
    chain = set(lineage(app.queue))
    return [
        c
        for c in counters
        if c.scope in chain
        and ((c.scope_type == USER and c.name == app.user) or (c.scope_type == GROUP and c.name == app.group))
    ]
