"""The application and user/group part of a reserve (:mod:`quota_ledger.ledger.reserve`).

The requests of a reserve (one, or a batch's set) are opened in order, each seeing those before
it: their application rows are locked with one statement and changed in memory (a new
application, or a new run of a finished one, is started by its first request only, which then
counts ``applications: 1``; a request naming another user's or queue's application is refused),
written with one insert and one update, and the user/group counters that enforce them are locked
together, the missing ones created first with what the application rows held *before* the
reserve (the reserve adds its own requests' deltas once it has decided them).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from quota_ledger.config import identity
from quota_ledger.config.identity import Key
from quota_ledger.config.rules import PartitionRules
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import applications
from quota_ledger.model import tracking
from quota_ledger.model.counters import Counter
from quota_ledger.model.errors import QuotaLedgerError
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.requests import ReserveRequest
from quota_ledger.model.tracking import AppState


@dataclass(frozen=True, slots=True)
class Member:
    """A request of a reserve, as it sees the ledger after the requests before it."""

    place: int
    request: ReserveRequest
    #: what it counts against: its resources, and ``applications: 1`` when it starts its application
    requested: Mapping[str, int]
    #: (kind, name, queue, resource) -> limit of every user/group counter that enforces it
    scoped: Mapping[Key, int] = field(default_factory=dict)
    #: its application row (None: untracked)
    app_key: str | None = None


@dataclass(slots=True)
class Apps:
    """The application rows of a reserve's requests: as locked before it, and as it leaves them."""

    before: dict[str, AppState]
    after: dict[str, AppState]
    #: the requests refused for their application row (another user's or queue's), by place
    refused: dict[int, QuotaLedgerError] = field(default_factory=dict)


def members(
    tx: LedgerTx,
    rules: PartitionRules,
    candidates: Sequence[tuple[int, ReserveRequest]],
    now: datetime,
) -> tuple[list[Member], Apps]:
    """Lock the application rows of ``candidates`` (step 4 of the lock order) and open each
    tracked one's application in memory, in order; the members (those not refused for their
    application row) and the rows."""
    partition = candidates[0][1].partition
    keys = {key for _, r in candidates if (key := key_of(r)) is not None}
    before = tx.lock_apps(partition, keys)
    apps = Apps(before=before, after={key: copy.deepcopy(app) for key, app in before.items()})
    found: list[Member] = []
    for place, request in candidates:
        key = key_of(request)
        if key is None:
            found.append(Member(place=place, request=request, requested=dict(request.resources)))
            continue
        app = apps.after.get(key)
        started = False
        if app is None or app.state == tracking.FINISHED:
            # Nothing of a finished application is held: YuniKorn has forgotten it, so its id
            # is free for any user and queue.
            user, queue = request.user, request.queue
            group = applications.group_for(rules, queue, user, request.groups)
            if app is None:
                app = tracking.new_app(partition, request.application, user, queue, group, now)
                apps.after[key] = app
            else:
                tracking.restart(app, group, now, user=user, queue=queue)
            started = app.counts
        else:
            try:
                applications.check_owner(app, request.user, request.queue)
            except QuotaLedgerError as error:
                apps.refused[place] = error
                continue
        tracking.add_reserved(app, request.resources)
        requested = {**request.resources, APPLICATIONS: 1} if started else dict(request.resources)
        scoped = applications.identity_limits(rules, app.queue, app.user, app.group, requested)
        found.append(Member(place=place, request=request, requested=requested, scoped=scoped, app_key=key))
    return found, apps


def save(tx: LedgerTx, apps: Apps, keys: Iterable[str]) -> None:
    """Write the application rows of ``keys``: a multi-row insert of the new ones, an update
    of the others."""
    wanted = sorted(set(keys))
    tx.insert_apps(apps.after[key] for key in wanted if key not in apps.before)
    tx.update_apps(apps.after[key] for key in wanted if key in apps.before)


def lock_counters(
    tx: LedgerTx,
    partition: str,
    found: Sequence[Member],
    apps: Apps,
    now: datetime,
    *,
    before_write: Callable[[], None],
) -> tuple[dict[Key, Counter], set[Key]]:
    """Lock the user/group counters that enforce ``found`` (step 7), creating the missing
    ones (``before_write`` is called first); the counters by key, and the keys created."""
    limits = {key: limit for member in found for key, limit in member.scoped.items()}
    if not limits:
        return {}, set()
    have = applications.lock_identity(tx, partition, limits)
    missing = {key: limits[key] for key in limits.keys() - have.keys()}
    if missing:
        before_write()
        _create(tx, partition, missing, apps, now)
        have = applications.lock_identity(tx, partition, limits)
    return have, set(missing)


def _create(tx: LedgerTx, partition: str, limits: Mapping[Key, int], apps: Apps, now: datetime) -> None:
    """Insert counters (skipping any a concurrent transaction created first) holding what the
    application rows held before the set: the set has written its own rows already, so those
    are taken as they were locked (its new ones not at all). The other rows are locked, as
    :func:`.applications._create` locks them."""
    keys = applications.counted_keys(tx, partition, limits) - apps.after.keys()
    rows = [*tx.lock_apps(partition, keys).values(), *apps.before.values()]
    values = {key: (*identity.value(rows, key), limit) for key, limit in limits.items()}
    tx.insert_identity_counters(partition, values, now)


def key_of(request: ReserveRequest) -> str | None:
    """The application row a request is tracked in (None: untracked)."""
    if not applications.tracked(request.user, request.application):
        return None
    return tracking.app_key(request.application, request.user, request.queue)
