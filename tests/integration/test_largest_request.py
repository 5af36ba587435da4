"""The largest request the bounds allow goes through every operation, on every decision path.

A queue as deep as a path of :data:`~quota_ledger.model.validation.MAX_PATH_LENGTH` characters
holds (126 levels), as many resources as one request may name, a user and as many groups as a
request may carry, under user and group limits: a commit, a release, a rollback or an expiry
of it locks the user/group counters of the user and the group on every level for every
resource and the running applications, 16,380 keys. One statement of one lookup per key,
OR-ed, is nested deeper than SQLite allows (1,000), which failed each of those operations and,
once the reservation ran out, every sweep of the ledger.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from quota_ledger import InvalidRequest, QuotaEngine, ReservationState
from quota_ledger.model import validation
from quota_ledger.model.values import Reservation, Usage

SEGMENTS = (validation.MAX_PATH_LENGTH - len("root")) // len(".q")
#: the deepest queue a path may name: root and 125 levels below it
QUEUE = "root" + ".q" * SEGMENTS
RESOURCES = {f"r{i:02d}": "1" for i in range(validation.DEFAULT_MAX_RESOURCES_PER_REQUEST)}
GROUPS = [f"g{i:03d}" for i in range(validation.MAX_GROUPS)]
#: the group the user's application is tracked against: the one with a limit of its own
GROUP = GROUPS[-1]
_MAX = "{" + ", ".join(f"{name}: 1000" for name in RESOURCES) + "}"
CONFIG = f"""
partitions:
- name: default
  queues:
  - name: root
    limits:
    - users: ["*"]
      maxapplications: 10
      maxresources: {_MAX}
    - groups: [{GROUP}]
      maxapplications: 10
      maxresources: {_MAX}
    queues:
    - name: q
      limits:
      - users: [ann]
        maxapplications: 10
        maxresources: {_MAX}
      - groups: [{GROUP}]
        maxapplications: 10
        maxresources: {_MAX}
"""


def test_the_request_is_the_largest_the_bounds_allow() -> None:
    assert validation.queue(QUEUE) == QUEUE
    assert len(QUEUE.split(".")) == 126
    with pytest.raises(InvalidRequest):
        validation.queue(QUEUE + ".q")
    validation.Bounds().request(RESOURCES)
    with pytest.raises(InvalidRequest):
        validation.Bounds().request({**RESOURCES, "one-more": "1"})
    assert validation.names(GROUPS, "groups") == tuple(GROUPS)
    with pytest.raises(InvalidRequest):
        validation.names([*GROUPS, "one-more"], "groups")


@pytest.fixture
def configured(path_ledger: QuotaEngine) -> QuotaEngine:
    path_ledger.apply_config(CONFIG)
    return path_ledger


def reserve(ledger: QuotaEngine, ttl: float = 600, application: str = "app-1") -> Reservation:
    return ledger.reserve(QUEUE, RESOURCES, user="ann", groups=GROUPS, application=application, ttl=ttl)


def used(ledger: QuotaEngine, kind: str) -> dict[str, Any]:
    """What the user or the group holds (reserved or in use) at root and at root.q, and its
    running applications there, as its usage report says."""
    found = ledger.user_usage("ann") if kind == "user" else ledger.group_usage(GROUP)
    root = found["queues"]
    (child,) = root["children"]
    return {
        queue["queuePath"]: (queue.get("resourceUsage", {}), sorted(queue.get("runningApplications", [])))
        for queue in (root, child)
    }


def held(ledger: QuotaEngine) -> dict[str, Any]:
    """:func:`used` of the user and of the group, when they hold the same."""
    user, group = used(ledger, "user"), used(ledger, "group")
    assert user == group
    return user


ONE_EACH = {
    "root": ({name: 1 for name in RESOURCES}, ["app-1"]),
    "root.q": ({name: 1 for name in RESOURCES}, ["app-1"]),
}
NOTHING = {"root": ({}, []), "root.q": ({}, [])}


def test_the_largest_request_is_reserved_committed_and_released(configured: QuotaEngine) -> None:
    reservation = reserve(configured)
    assert held(configured) == ONE_EACH
    assert configured.commit(reservation.id).state is ReservationState.COMMITTED
    assert held(configured) == ONE_EACH
    assert configured.usage(QUEUE)["r63"] == Usage(in_use=1, reserved=0, limit=None)
    configured.release_reservation(reservation.id, finished=True)
    assert held(configured) == NOTHING
    assert configured.usage(QUEUE)["r63"] == Usage(in_use=0, reserved=0, limit=None)
    assert configured.audit() == []


def test_the_largest_request_is_rolled_back(configured: QuotaEngine) -> None:
    reservation = reserve(configured)
    assert configured.rollback(reservation.id).state is ReservationState.ROLLED_BACK
    assert held(configured) == NOTHING
    assert configured.usage(QUEUE)["r63"] == Usage(in_use=0, reserved=0, limit=None)
    assert configured.audit() == []


def test_the_largest_request_expires(configured: QuotaEngine) -> None:
    reservation = reserve(configured, ttl=0.05)
    time.sleep(0.1)
    assert configured.expire() == 1
    assert configured.get(reservation.id).state is ReservationState.EXPIRED
    assert held(configured) == NOTHING
    assert configured.usage(QUEUE)["r63"] == Usage(in_use=0, reserved=0, limit=None)
    assert configured.audit() == []


def test_the_largest_requests_are_committed_together(configured: QuotaEngine) -> None:
    """With batching, commits decided at once are one set (one lock of every key of both)."""
    first, second = reserve(configured), reserve(configured, application="app-2")
    outcomes = configured.decide_all([configured.prepare_commit(r.id) for r in (first, second)])
    assert [getattr(o, "state", o) for o in outcomes] == [ReservationState.COMMITTED] * 2
    assert configured.batch_stats.fallbacks == 0  # not one by one after the batch failed
    both = ({name: 2 for name in RESOURCES}, ["app-1", "app-2"])
    assert held(configured) == {"root": both, "root.q": both}
    assert configured.audit() == []
