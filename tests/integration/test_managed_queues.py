"""Queues whose limits Keystone owns refuse a local set_limits; the rest of the tree does not."""

from __future__ import annotations

import pytest

from quota_ledger import QuotaEngine
from quota_ledger.config.model import MANAGED_BY
from quota_ledger.model.errors import ManagedQueue

CONFIG = {
    "partitions": [
        {
            "name": "default",
            "queues": [
                {
                    "name": "root",
                    "queues": [
                        {"name": "local", "resources": {"max": {"vcore": "4"}}},
                        {
                            "name": "p1",
                            "resources": {"max": {"vcore": "2"}},
                            "properties": {MANAGED_BY: "keystone"},
                        },
                    ],
                }
            ],
        }
    ]
}


def test_set_limits_on_an_owned_queue_is_refused_naming_keystone(ledger: QuotaEngine) -> None:
    version = ledger.apply_config(CONFIG)
    with pytest.raises(ManagedQueue, match="come from Keystone") as refused:
        ledger.set_limits("root.p1", {"vcore": "8"})
    assert (refused.value.queue, refused.value.owned, refused.value.manager) == (
        "root.p1",
        "root.p1",
        "keystone",
    )
    with pytest.raises(ManagedQueue) as below:
        ledger.set_limits("root.p1.team", {"vcore": "1"})
    assert below.value.owned == "root.p1"
    assert ledger.config_version() == version
    assert ledger.limits()["root.p1"] == {"vcore": 2000}


def test_queues_not_owned_and_root_still_take_local_limits(ledger: QuotaEngine) -> None:
    version = ledger.apply_config(CONFIG)
    assert ledger.set_limits("root.local", {"vcore": "3"}) == version + 1
    assert ledger.set_limits("root", {"vcore": "100"}) == version + 2
    assert ledger.limits()["root.local"] == {"vcore": 3000}
