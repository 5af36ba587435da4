"""The reconciler's pure decisions: what a pod event asks of the ledger, and what a relist does
against what the ledger holds."""

from __future__ import annotations

from typing import Any

import pytest

from quota_ledger.engine.reservations import recharge_key
from quota_ledger.model.values import ReservationState
from quota_ledger.reconciler import relist
from quota_ledger.reconciler.decision import Action, Held, decide


def _pod(uid: str | None = "u1", phase: str | None = None, node: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"metadata": {"name": "p", "namespace": "team"}, "spec": {}}
    if uid:
        found["metadata"]["uid"] = uid
    if phase:
        found["status"] = {"phase": phase}
    if node:
        found["spec"]["nodeName"] = node
    return found


@pytest.mark.parametrize(
    ("event", "pod", "held", "action"),
    [
        # stored: charged at once, bound or not (Kubernetes counts a pod from creation)
        ("ADDED", _pod(), Held.PENDING, Action.CHARGE),
        ("ADDED", _pod(phase="Pending"), Held.UNKNOWN, Action.CHARGE),
        ("MODIFIED", _pod(node="n1"), Held.PENDING, Action.CHARGE),
        ("MODIFIED", _pod(node="n1", phase="Running"), Held.CHARGED, Action.NOTHING),
        ("MODIFIED", _pod(phase="Running"), Held.RELEASED, Action.NOTHING),
        # ended or gone: released once
        ("MODIFIED", _pod(phase="Succeeded"), Held.CHARGED, Action.RELEASE),
        ("MODIFIED", _pod(phase="Failed"), Held.PENDING, Action.RELEASE),
        ("MODIFIED", _pod(phase="Failed"), Held.RELEASED, Action.NOTHING),
        ("DELETED", _pod(phase="Running"), Held.CHARGED, Action.RELEASE),
        ("DELETED", _pod(), Held.UNKNOWN, Action.RELEASE),
        ("DELETED", _pod(phase="Succeeded"), Held.RELEASED, Action.NOTHING),
        # without a uid there is no key to find it by
        ("ADDED", _pod(uid=None), Held.UNKNOWN, Action.NOTHING),
    ],
)
def test_each_pod_event_asks_one_thing_of_the_ledger(
    event: str, pod: dict[str, Any], held: Held, action: Action
) -> None:
    assert decide(event, pod, held) is action


def _uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


PENDING, CHARGED, GONE, NOT_STORED, LATE, ENDED, UNKNOWN = (_uid(n) for n in range(7))


def test_a_relist_charges_live_pods_and_releases_committed_reservations_of_gone_ones() -> None:
    held = {
        PENDING: ("r1", ReservationState.PENDING),
        CHARGED: ("r2", ReservationState.COMMITTED),
        GONE: ("r3", ReservationState.COMMITTED),
        NOT_STORED: ("r4", ReservationState.PENDING),
        recharge_key(LATE): ("r5", ReservationState.COMMITTED),
        ENDED: ("r6", ReservationState.COMMITTED),
        "job-17": ("r7", ReservationState.COMMITTED),  # not a pod's: never the reconciler's
    }
    pods = [_pod(PENDING), _pod(CHARGED), _pod(UNKNOWN), _pod(LATE), _pod(ENDED, phase="Succeeded")]
    found = relist.diff(pods, held)
    assert [p["metadata"]["uid"] for p in found.charge] == [PENDING, UNKNOWN]
    assert sorted(found.release) == sorted([(ENDED, "r6"), (GONE, "r3")])
    assert found.held == {
        CHARGED: Held.CHARGED,
        LATE: Held.CHARGED,
        ENDED: Held.RELEASED,
        NOT_STORED: Held.PENDING,  # left to expire, or to be stored yet
    }
    assert found.ids == {CHARGED: "r2", LATE: "r5", NOT_STORED: "r4"}


def test_a_relist_of_an_ended_pod_the_ledger_never_held_releases_nothing() -> None:
    found = relist.diff([_pod(ENDED, phase="Failed")], {})
    assert (found.charge, found.release, found.held) == ([], [], {ENDED: Held.RELEASED})
