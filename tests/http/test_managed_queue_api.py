"""A queue whose limits Keystone owns, through the service and the CLI's --url."""

from __future__ import annotations

import pytest
from http_support import Service

from quota_ledger.cli.remote import RemoteEngine
from quota_ledger.config.model import MANAGED_BY
from quota_ledger.model.errors import ManagedQueue

OWNED = {
    "partitions": [
        {
            "name": "default",
            "queues": [
                {
                    "name": "root",
                    "queues": [
                        {
                            "name": "p1",
                            "resources": {"max": {"vcore": "2"}},
                            "properties": {MANAGED_BY: "keystone"},
                        }
                    ],
                }
            ],
        }
    ]
}


def test_set_limits_on_a_keystone_queue_is_409_and_the_client_raises_managed_queue(service: Service) -> None:
    service.engine.apply_config(OWNED)
    with service.client() as admin:
        refused = admin.put("/v1/queues/root.p1/limits", json={"resources": {"vcore": "4"}})
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "managed_queue"
    assert error["details"] == {"queue": "root.p1", "owned": "root.p1", "manager": "keystone"}
    assert "Keystone" in error["message"]
    remote = RemoteEngine(service.base, service.tokens["admin"])
    with pytest.raises(ManagedQueue) as raised:
        remote.set_limits("root.p1.team", {"vcore": "1"})
    assert (raised.value.owned, raised.value.manager) == ("root.p1", "keystone")
