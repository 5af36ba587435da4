"""charge_pod: a pod the cluster already runs is charged, over a limit if need be, exactly once;
its pending reservation is committed; one that expired before the pod was seen is charged again
under a second key. On every backend."""

from __future__ import annotations

from typing import Any

import pytest

from quota_ledger import OverQuota, QuotaEngine, ReservationState
from quota_ledger.engine.reservations import recharge_key
from quota_ledger.model.values import Charged


def _pod(uid: str, cpu: str = "500m", namespace: str = "team") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{uid}", "namespace": namespace, "uid": uid},
        "spec": {"containers": [{"name": "app", "image": "x", "resources": {"requests": {"cpu": cpu}}}]},
    }


def _two_pods_quota(ledger: QuotaEngine) -> None:
    ledger.apply_resource_quota(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "compute", "namespace": "team"},
            "spec": {"hard": {"pods": "2", "requests.cpu": "1"}},
        }
    )


def test_charging_commits_the_pending_reservation_of_an_admitted_pod(ledger: QuotaEngine) -> None:
    admitted = ledger.admit_pod(_pod("a"), user="sue", ttl=120)
    first = ledger.charge_pod(_pod("a"))
    assert (first.reservation.id, first.reservation.state) == (admitted.id, ReservationState.COMMITTED)
    assert (first.how, first.overruns) == (Charged.COMMITTED, ())
    again = ledger.charge_pod(_pod("a"))
    assert (again.reservation.id, again.how, again.overruns) == (admitted.id, Charged.ALREADY, ())
    assert ledger.usage("root.team")["vcore"].in_use == 500
    assert ledger.audit() == []


def test_an_unknown_pod_over_a_quota_is_charged_and_its_overrun_reported(ledger: QuotaEngine) -> None:
    _two_pods_quota(ledger)
    ledger.charge_pod(_pod("a", cpu="600m"))
    with pytest.raises(OverQuota):
        ledger.reserve_pod(_pod("b", cpu="600m"))
    charged = ledger.charge_pod(_pod("b", cpu="600m"))
    assert (charged.reservation.state, charged.how) == (ReservationState.COMMITTED, Charged.CHARGED)
    assert [(v.scope, v.resource, v.limit, v.in_use, v.requested) for v in charged.overruns] == [
        ("team/compute", "requests.cpu", 1000, 600, 600)
    ]
    assert ledger.resource_quota_status("team", "compute")["used"] == {"pods": "2", "requests.cpu": "1200m"}
    assert ledger.charge_pod(_pod("b", cpu="600m")).how is Charged.ALREADY  # once
    assert ledger.audit() == []


def test_a_pod_whose_reservation_expired_is_charged_under_a_second_key(ledger: QuotaEngine) -> None:
    first = ledger.admit_pod(_pod("late"), user="sue", ttl=0.001)
    charge = ledger.charge_pod(_pod("late"))
    assert charge.how is Charged.CHARGED
    charged = charge.reservation
    assert charged.id != first.id
    assert (charged.key, charged.state) == (recharge_key("late"), ReservationState.COMMITTED)
    assert ledger.get(first.id).state is ReservationState.EXPIRED
    assert ledger.charge_pod(_pod("late")).reservation.id == charged.id
    assert ledger.held_keys() == {recharge_key("late"): (charged.id, ReservationState.COMMITTED)}
    ledger.release_reservation(charged.id)
    assert ledger.held_keys() == {}
    assert ledger.usage("root.team")["vcore"].in_use == 0
    assert ledger.audit() == []


def test_held_keys_lists_pending_and_committed_unreleased_reservations(ledger: QuotaEngine) -> None:
    pending = ledger.admit_pod(_pod("p"), user="sue", ttl=120)
    committed = ledger.charge_pod(_pod("c")).reservation
    released = ledger.charge_pod(_pod("r")).reservation
    ledger.release_reservation(released.id)
    ledger.reserve("root.team", {"vcore": "1"})  # no key
    assert ledger.held_keys() == {
        "p": (pending.id, ReservationState.PENDING),
        "c": (committed.id, ReservationState.COMMITTED),
    }
