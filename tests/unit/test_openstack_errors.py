"""How the service answers the Keystone sync's refusals and Keystone's failures."""

from __future__ import annotations

from quota_ledger.http.errors import status_of
from quota_ledger.model.errors import ManagedQueue
from quota_ledger.openstack.keystone import KeystoneError, KeystoneUnreachable


def test_a_managed_queue_is_a_conflict_naming_keystone() -> None:
    refused = ManagedQueue("root.p1.team", "root.p1", "keystone")
    assert status_of(refused) == (409, "managed_queue")
    assert str(refused).startswith("the limits of queue root.p1.team (under root.p1) come from Keystone")


def test_keystone_down_is_unavailable_and_its_refusals_a_bad_gateway() -> None:
    assert status_of(KeystoneUnreachable("cannot reach Keystone")) == (503, "keystone_unavailable")
    assert status_of(KeystoneError("Keystone answered 403", status=403)) == (502, "keystone_error")
