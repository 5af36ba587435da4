"""charge_pod: a pod the cluster already runs is charged, over a limit if need be, exactly once;
its pending reservation is committed; one that expired before the pod was seen is charged again
under a second key. On every backend."""

from __future__ import annotations

from typing import Any

import pytest

from quota_ledger import OverQuota, QuotaEngine, ReservationState
from quota_ledger.engine.reservations import recharge_key


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
    charged, overruns = ledger.charge_pod(_pod("a"))
    assert (charged.id, charged.state, overruns) == (admitted.id, ReservationState.COMMITTED, [])
    again, overruns = ledger.charge_pod(_pod("a"))
    assert (again.id, again.state, overruns) == (admitted.id, ReservationState.COMMITTED, [])
    assert ledger.usage("root.team")["vcore"].in_use == 500
    assert ledger.audit() == []


def test_an_unknown_pod_over_a_quota_is_charged_and_its_overrun_reported(ledger: QuotaEngine) -> None:
    _two_pods_quota(ledger)
    ledger.charge_pod(_pod("a", cpu="600m"))
    with pytest.raises(OverQuota):
        ledger.reserve_pod(_pod("b", cpu="600m"))
    charged, overruns = ledger.charge_pod(_pod("b", cpu="600m"))
    assert charged.state is ReservationState.COMMITTED
    assert [(v.scope, v.resource, v.limit, v.in_use, v.requested) for v in overruns] == [
        ("team/compute", "requests.cpu", 1000, 600, 600)
    ]
    assert ledger.resource_quota_status("team", "compute")["used"] == {"pods": "2", "requests.cpu": "1200m"}
    assert ledger.charge_pod(_pod("b", cpu="600m"))[1] == []  # once
    assert ledger.audit() == []


def test_a_pod_whose_reservation_expired_is_charged_under_a_second_key(ledger: QuotaEngine) -> None:
    first = ledger.admit_pod(_pod("late"), user="sue", ttl=0.001)
    charged, _ = ledger.charge_pod(_pod("late"))
    assert charged.id != first.id
    assert (charged.key, charged.state) == (recharge_key("late"), ReservationState.COMMITTED)
    assert ledger.get(first.id).state is ReservationState.EXPIRED
    assert ledger.charge_pod(_pod("late"))[0].id == charged.id
    assert ledger.held_keys() == {recharge_key("late"): (charged.id, ReservationState.COMMITTED)}
    ledger.release_reservation(charged.id)
    assert ledger.held_keys() == {}
    assert ledger.usage("root.team")["vcore"].in_use == 0
    assert ledger.audit() == []


def test_held_keys_lists_pending_and_committed_unreleased_reservations(ledger: QuotaEngine) -> None:
    pending = ledger.admit_pod(_pod("p"), user="sue", ttl=120)
    committed, _ = ledger.charge_pod(_pod("c"))
    released, _ = ledger.charge_pod(_pod("r"))
    ledger.release_reservation(released.id)
    ledger.reserve("root.team", {"vcore": "1"})  # no key
    assert ledger.held_keys() == {
        "p": (pending.id, ReservationState.PENDING),
        "c": (committed.id, ReservationState.COMMITTED),
    }
