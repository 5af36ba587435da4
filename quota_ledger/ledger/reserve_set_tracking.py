"""The application and user/group part of a reserve set (:mod:`quota_ledger.ledger.reserve_set`).

What :func:`.applications.open_app`, :func:`.applications.save` and
:func:`.applications.lock_for_reserve` do for one reservation, done for the members of a set
in batch order, each seeing those before it: their application rows are locked with one
statement and changed in memory (a new application is started by its first member only, which
then counts ``applications: 1``), written with one insert and one update, and the user/group
counters that enforce them are locked together, the missing ones created first with what the
application rows held *before* the set (the set adds its own members' deltas once it has
decided them, as each step adds its own request to counters it created).

A request is left to its step when its application row is finished (its step starts a new
run) or belongs to another user or queue (its step refuses it).
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
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.requests import ReserveRequest
from quota_ledger.model.tracking import AppState


@dataclass(frozen=True, slots=True)
class Member:
    """A request decided in a set, as its general path would see it after those before it."""

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
    """The application rows of a set's members: as locked before the set, and as it leaves them."""

    before: dict[str, AppState]
    after: dict[str, AppState]


def members(
    tx: LedgerTx,
    rules: PartitionRules,
    candidates: Sequence[tuple[int, ReserveRequest]],
    now: datetime,
) -> tuple[list[Member], Apps]:
    """Lock the application rows of ``candidates`` (step 4 of the lock order) and open each
    tracked one's application in memory, in order; the members (candidates not left to their
    steps) and the rows."""
    partition = candidates[0][1].partition
    keys = {key for _, r in candidates if (key := key_of(r)) is not None}
    before = tx.lock_apps(partition, keys)
    after = {key: copy.deepcopy(app) for key, app in before.items()}
    found: list[Member] = []
    aside: set[str] = set()
    for place, request in candidates:
        key = key_of(request)
        if key is None:
            found.append(Member(place=place, request=request, requested=dict(request.resources)))
            continue
        app = after.get(key)
        started = False
        if app is None:
            group = applications.group_for(rules, request.queue, request.user, request.groups)
            app = tracking.new_app(partition, request.application, request.user, request.queue, group, now)
            after[key] = app
            started = app.counts
        elif key in aside or app.state == tracking.FINISHED or not _owns(app, request):
            aside.add(key)  # its step starts a new run, or refuses it; those after it wait
            continue
        tracking.add_reserved(app, request.resources)
        requested = {**request.resources, APPLICATIONS: 1} if started else dict(request.resources)
        scoped = applications.identity_limits(rules, app.queue, app.user, app.group, requested)
        found.append(Member(place=place, request=request, requested=requested, scoped=scoped, app_key=key))
    return found, Apps(before=before, after=after)


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


def _owns(app: AppState, request: ReserveRequest) -> bool:
    return app.user == request.user and app.queue == request.queue
