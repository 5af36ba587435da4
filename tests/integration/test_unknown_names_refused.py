"""Names no configuration knows: ``set_limits`` warns about a likely typo as ``reserve`` does,
and a partition with ``unknownnames: refuse`` refuses both instead, changing nothing. On every
decision path (backend x batching x functions)."""

from __future__ import annotations

import pytest
from sql_rows import rows
from sqlalchemy.engine import URL

from quota_ledger import QuotaEngine
from quota_ledger.model.errors import UnknownQueue, UnknownResource

CONFIG = """
partitions:
  - name: default
    unknownnames: {setting}
    queues:
      - name: root
        queues:
          - name: dev
            resources: {{max: {{nvidia.com/gpu: 4, vcore: 8}}}}
            limits:
              - limit: everyone
                users: ["*"]
                maxresources: {{vcore: 4}}
"""


def _counters(url: URL) -> list[tuple[str, str]]:
    found = rows(url, "SELECT scope, resource FROM quota_usages ORDER BY scope, resource")
    return [(str(scope), str(resource)) for scope, resource in found]


def test_set_limits_warns_about_a_resource_close_to_a_limited_one(path_ledger: QuotaEngine) -> None:
    path_ledger.apply_config(CONFIG.format(setting="warn"))
    version = path_ledger.set_limits("root.dev", {"vcores": 10})
    assert version == 2
    assert version.warnings == (
        "`vcores` is not limited anywhere in partition default; did you mean `vcore`?",
    )
    assert path_ledger.limits()["root.dev"]["vcores"] == 10
    assert path_ledger.set_limits("root.dev", {"vcore": 6}).warnings == ()


def test_a_refusing_partition_refuses_an_unknown_resource_and_leaves_no_trace(
    path_ledger: QuotaEngine, path_url: URL
) -> None:
    path_ledger.apply_config(CONFIG.format(setting="refuse"))
    before = _counters(path_url)
    with pytest.raises(UnknownResource) as caught:
        path_ledger.reserve("root.dev", {"gpus": 1, "vcore": 1}, user="sue", application="a1")
    assert caught.value.suggestions == {"gpus": "nvidia.com/gpu"}
    with pytest.raises(UnknownQueue) as queue_caught:
        path_ledger.reserve("root.nope", {"vcore": 1})
    assert queue_caught.value.suggestion == "root.dev"
    assert _counters(path_url) == before
    assert rows(path_url, "SELECT COUNT(*) FROM reservations") == [(0,)]
    assert rows(path_url, "SELECT COUNT(*) FROM quota_applications") == [(0,)]
    made = path_ledger.reserve("root.dev", {"vcore": 1}, user="sue", application="a1")
    assert made.warnings == ()


def test_many_decided_together_refuse_only_the_unknown_ones(path_ledger: QuotaEngine) -> None:
    path_ledger.apply_config(CONFIG.format(setting="refuse"))
    known = path_ledger.reserve("root.dev", {"vcore": 1})  # the queue's counters exist
    assert known.warnings == ()
    operations = [
        path_ledger.prepare_reserve("root.dev", {"vcore": 1}),
        path_ledger.prepare_reserve("root.dev", {"vcores": 1}),
        path_ledger.prepare_reserve("root.dev", {"vcore": 1}, user="bob", application="b"),
    ]
    first, typo, third = path_ledger.decide_all(operations)
    assert isinstance(typo, UnknownResource)
    assert not isinstance(first, Exception)
    assert not isinstance(third, Exception)
    assert path_ledger.usage("root.dev")["vcore"].reserved == 3000


def test_a_refusing_partition_refuses_a_limit_on_a_likely_typo(path_ledger: QuotaEngine) -> None:
    path_ledger.apply_config(CONFIG.format(setting="refuse"))
    with pytest.raises(UnknownResource):
        path_ledger.set_limits("root.dev", {"vcores": 10, "vcore": 2})
    with pytest.raises(UnknownQueue):
        path_ledger.set_limits("root.dve", {"vcore": 2})
    assert path_ledger.config_version() == 1
    assert path_ledger.limits()["root.dev"] == {"nvidia.com/gpu": 4, "vcore": 8000}
    assert path_ledger.set_limits("root.dev", {"ephemeral-storage": "1Gi"}) == 2  # new, not a typo


def test_switching_to_refuse_takes_effect_on_an_engine_with_older_rules(path_ledger: QuotaEngine) -> None:
    path_ledger.apply_config(CONFIG.format(setting="warn"))
    assert path_ledger.reserve("root.dev", {"gpus": 1}).warnings  # made, with a warning
    other = QuotaEngine.from_url(path_ledger.driver.engine.url)
    try:
        other.apply_config(CONFIG.format(setting="refuse"))
    finally:
        other.close()
    with pytest.raises(UnknownResource):
        path_ledger.reserve("root.dev", {"gpus": 1})
