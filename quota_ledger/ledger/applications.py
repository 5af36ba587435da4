"""The application and user/group part of reserve, resolve, release and expire.

Runs inside the ledger's transactions, between the reservation rows and the queue counters
in the lock order: application rows first, then (after the queue and subtree counters) the
user and group counters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from quota_ledger.config.identity import Key
from quota_ledger.config.rules import GROUP, USER, PartitionRules
from quota_ledger.driver.counters import MissingCounters
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.model import tracking
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.limits import Counter
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.queues import lineage
from quota_ledger.model.tracking import AppState
from quota_ledger.model.values import Reservation


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


def identity_keys(
    rules: PartitionRules, queue: str, user: str | None, group: str | None, requested: Iterable[str]
) -> set[Key]:
    """(kind, name, queue, resource) of every user/group counter that enforces a request."""
    wanted = set(requested)
    return {
        (s.kind, s.name, s.queue, resource)
        for s in rules.identity_scopes(queue, user, group)
        for resource in s.rule.counters()
        if resource in wanted
    }


def check_owner(app: AppState, user: str | None, queue: str) -> None:
    if app.user != user or app.queue != queue:
        raise InvalidRequest(
            f"application {app.application!r} belongs to user {app.user!r} in queue {app.queue}",
            field="application",
        )


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
) -> list[Counter]:
    """Lock the user/group counters that enforce a reservation; missing ones are created
    (in a transaction of their own) and the reservation starts again."""
    needed = identity_keys(rules, app.queue, app.user, app.group, requested)
    if not needed:
        return []
    found = tx.lock_identity_counters(
        app.partition,
        {(k, n) for k, n, _, _ in needed},
        {q for _, _, q, _ in needed},
        {r for _, _, _, r in needed},
    )
    have = {(c.scope_type, c.name or "", c.scope, c.resource): c for c in found}
    missing = sorted(needed - have.keys())
    if missing:
        raise MissingCounters(app.partition, [], identity=missing)
    return [have[key] for key in sorted(needed)]


def lock_of(tx: LedgerTx, apps: Iterable[AppState], resources: Iterable[str]) -> list[Counter]:
    """Lock every user/group counter that charges these applications, for ``resources``."""
    app_list = list(apps)
    pairs = {(USER, a.user) for a in app_list if a.user is not None}
    pairs |= {(GROUP, a.group) for a in app_list if a.group is not None}
    if not pairs or not app_list:
        return []
    scopes = {q for a in app_list for q in lineage(a.queue)}
    return tx.lock_identity_counters(app_list[0].partition, pairs, scopes, resources)


def charges(app: AppState, counters: Iterable[Counter]) -> list[Counter]:
    """The counters among ``counters`` that ``app``'s usage is charged to."""
    chain = set(lineage(app.queue))
    return [
        c
        for c in counters
        if c.scope in chain
        and ((c.scope_type == USER and c.name == app.user) or (c.scope_type == GROUP and c.name == app.group))
    ]


def add_delta(deltas: dict[int, tuple[int, int]], counter: Counter, in_use: int, reserved: int) -> None:
    have = deltas.get(counter.id, (0, 0))
    deltas[counter.id] = (have[0] + in_use, have[1] + reserved)


def app_delta(counter: Counter, stopped: bool) -> tuple[int, int]:
    """A stopping application's change on an ``applications`` counter."""
    return (-1, 0) if stopped and counter.resource == APPLICATIONS else (0, 0)
