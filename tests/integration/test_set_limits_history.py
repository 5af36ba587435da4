"""``set_limits`` records one queue's change, not a copy of the configuration: the version in
force is the newest snapshot plus the changes after it, every reader sees the same
configuration as before, and another engine moves its rules forward without compiling the
whole configuration again. On every backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from quota_ledger import ConfigError, OverQuota, QuotaEngine
from quota_ledger.driver.tx import LedgerTx

CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            resources: {max: {vcore: 10}}
            limits:
              - limit: everyone
                users: ["*"]
                maxresources: {vcore: 4}
          - name: prod
            resources: {max: {vcore: 20}}
"""


@pytest.fixture
def ledger(db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(db_url)
    assert engine.apply_config(CONFIG) == 1
    yield engine
    engine.close()


def _rows(url: URL, sql: str) -> list[tuple[object, ...]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql))]
    finally:
        engine.dispose()


def _snapshots(url: URL) -> list[object]:
    return [v for (v,) in _rows(url, "SELECT version FROM quota_configs WHERE version > 0 ORDER BY version")]


def _changes(url: URL) -> list[tuple[object, ...]]:
    sql = "SELECT version, queue, resource, hard_limit FROM quota_config_changes ORDER BY version, resource"
    return _rows(url, sql)


def test_set_limits_records_the_change_and_not_a_snapshot(ledger: QuotaEngine, db_url: URL) -> None:
    assert ledger.set_limits("root.prod", {"vcore": 8, "memory": "1Gi"}) == 2
    assert ledger.set_limits("root.prod", {"memory": None}) == 3
    assert _snapshots(db_url) == [1]
    assert _changes(db_url) == [
        (2, "root.prod", "memory", 2**30),
        (2, "root.prod", "vcore", 8000),
        (3, "root.prod", "memory", None),
    ]
    assert _rows(db_url, "SELECT version FROM quota_config_head") == [(3,)]
    assert ledger.limits()["root.prod"] == {"vcore": 8000}


def test_the_replayed_configuration_is_the_one_a_whole_apply_would_store(ledger: QuotaEngine) -> None:
    ledger.set_limits("root.prod", {"vcore": 8, "gpu": 2})
    ledger.set_limits("root.dev", {"vcore": 5})
    ledger.set_limits("root", {"memory": "64Gi"})
    document = ledger.config()
    prod = document["partitions"][0]["queues"][0]["queues"][1]
    assert prod == {"name": "prod", "resources": {"max": {"gpu": "2", "vcore": "8000m"}}}
    # identical to what is in force: no version, so the replay equals the stored form exactly
    assert ledger.apply_config(document) == 4


def test_a_change_that_breaks_a_rule_is_refused_and_changes_nothing(ledger: QuotaEngine, db_url: URL) -> None:
    with pytest.raises(ConfigError, match="more than the queue's max"):
        ledger.set_limits("root.dev", {"vcore": 3})  # its user limit is 4 vcore
    ledger.apply_config(CONFIG + "            queues: [{name: x, resources: {max: {vcore: 15}}}]\n")
    with pytest.raises(ConfigError, match="more than the max above it"):
        ledger.set_limits("root.prod", {"vcore": 12})  # its child's max is 15 vcore
    assert _changes(db_url) == []
    assert ledger.config_version() == 2


def test_the_same_limits_again_make_no_version(ledger: QuotaEngine, db_url: URL) -> None:
    assert ledger.set_limits("root.prod", {"vcore": 8}) == 2
    assert ledger.set_limits("root.prod", {"vcore": 8, "gpu": None}) == 2
    assert ledger.set_limits("root", {"gpu": None}) == 2
    assert _changes(db_url) == [(2, "root.prod", "vcore", 8000)]


def test_a_new_limit_starts_from_the_usage_below_it(ledger: QuotaEngine) -> None:
    ledger.reserve("root.prod.a", {"memory": 600})
    ledger.set_limits("root.prod", {"memory": 1000})
    with pytest.raises(OverQuota):
        ledger.reserve("root.prod.b", {"memory": 500})
    ledger.reserve("root.prod.b", {"memory": 400})
    ledger.set_limits("root", {"memory": 1000})
    with pytest.raises(OverQuota):
        ledger.reserve("root.dev", {"memory": 1})
    assert ledger.audit() == []


def test_another_engine_moves_forward_without_compiling_the_whole_configuration(
    ledger: QuotaEngine, db_url: URL
) -> None:
    with QuotaEngine.from_url(db_url) as other:
        other.reserve("root.prod", {"vcore": 1})
        compiled = other.rules.compiles
        ledger.set_limits("root.prod", {"vcore": 2})
        ledger.set_limits("root", {"vcore": 50})
        with pytest.raises(OverQuota):
            other.reserve("root.prod", {"vcore": 2})
        assert other.limits()["root.prod"] == {"vcore": 2000}
        assert other.rules.compiles == compiled
        other.set_limits("root.dev", {"vcore": 6})  # its check index moves forward too
        assert other.rules.compiles == compiled
        ledger.apply_config(CONFIG)  # a whole configuration is compiled whole
        other.reserve("root.prod", {"vcore": 2})
        assert other.rules.compiles == compiled + 1


def test_a_whole_apply_after_changes_stores_a_snapshot(ledger: QuotaEngine, db_url: URL) -> None:
    ledger.set_limits("root.prod", {"vcore": 8})
    assert ledger.apply_config(CONFIG) == 3
    assert _snapshots(db_url) == [1, 3]
    assert ledger.limits()["root.prod"] == {"vcore": 20000}


def test_a_queue_not_configured_yet_is_added_by_a_change(ledger: QuotaEngine, db_url: URL) -> None:
    ledger.reserve("root.prod.p1.x", {"vcore": 1})  # usage of a dynamic queue
    assert ledger.set_limits("root.prod.p1", {"vcore": 2}) == 2  # was dynamic
    assert ledger.set_limits("root.projects.a.b", {"memory": "1Gi"}) == 3  # two levels missing
    assert _snapshots(db_url) == [1]
    assert _changes(db_url) == [(2, "root.prod.p1", "vcore", 2000), (3, "root.projects.a.b", "memory", 2**30)]
    assert ledger.limits()["root.prod.p1"] == {"vcore": 2000}
    with pytest.raises(OverQuota):
        ledger.reserve("root.prod.p1.y", {"vcore": "1500m"})  # the new limit counts what was in use
    ledger.reserve("root.prod.p1.y", {"vcore": 1})
    root = ledger.config()["partitions"][0]["queues"][0]
    assert root["queues"][1]["queues"] == [{"name": "p1", "resources": {"max": {"vcore": "2000m"}}}]
    assert root["queues"][2] == {
        "name": "projects",
        "queues": [{"name": "a", "queues": [{"name": "b", "resources": {"max": {"memory": "1073741824"}}}]}],
    }
    assert ledger.audit() == []


def test_a_new_queue_replays_to_what_a_whole_version_would_store(ledger: QuotaEngine, db_url: URL) -> None:
    edited = ledger.config()
    queues = edited["partitions"][0]["queues"][0]["queues"]
    queues[0]["queues"] = [{"name": "t", "resources": {"max": {"vcore": "1000m"}}}]
    queues.append({"name": "z", "queues": [{"name": "y", "resources": {"max": {"gpu": "1"}}}]})
    ledger.set_limits("root.dev.t", {"vcore": 1})
    ledger.set_limits("root.z.y", {"gpu": 1})
    assert _snapshots(db_url) == [1]
    assert ledger.config() == edited
    assert ledger.apply_config(edited) == 3  # the same configuration: no version


def test_a_new_queue_that_breaks_a_rule_is_refused_and_changes_nothing(
    ledger: QuotaEngine, db_url: URL
) -> None:
    with pytest.raises(ConfigError, match="more than the max above it"):
        ledger.set_limits("root.dev.a.b", {"vcore": 11})
    with pytest.raises(ConfigError, match="more than once"):
        ledger.set_limits("root.Prod", {"vcore": 1})
    assert _changes(db_url) == []
    assert ledger.config_version() == 1


def test_another_engine_moves_forward_by_a_new_queue(ledger: QuotaEngine, db_url: URL) -> None:
    with QuotaEngine.from_url(db_url) as other:
        other.reserve("root.prod", {"vcore": 1})
        compiled = other.rules.compiles
        ledger.set_limits("root.p.q", {"vcore": 1})
        with pytest.raises(OverQuota):
            other.reserve("root.p.q", {"vcore": 2})
        assert other.limits()["root.p.q"] == {"vcore": 1000}
        other.set_limits("root.p.r", {"vcore": 1})  # its check index moves forward too
        with pytest.raises(ConfigError, match="more than once"):
            other.set_limits("root.P.s", {"vcore": 1})
        assert other.rules.compiles == compiled
        assert _snapshots(db_url) == [1]
        assert ledger.set_limits("root.p.r", {"vcore": 3}) == 4


def test_a_new_partition_is_added_by_a_whole_version(ledger: QuotaEngine, db_url: URL) -> None:
    assert ledger.set_limits("root.a", {"vcore": 2}, partition="other") == 2
    assert _snapshots(db_url) == [1, 2]
    assert ledger.limits(partition="other")["root.a"] == {"vcore": 2000}


def test_a_snapshot_that_lags_gets_a_kept_version_without_compiling(ledger: QuotaEngine, db_url: URL) -> None:
    """A transaction whose snapshot still shows an older version (a replica that lags, or a
    snapshot taken before the newest change) gets that version from the kept ones, or moves
    the nearest older one forward: the engine does not compile the whole configuration again."""
    with QuotaEngine.from_url(db_url) as other:
        other.reserve("root.prod", {"vcore": 1})
        compiled = other.rules.compiles
        for limit in (2, 3, 4):
            ledger.set_limits("root.prod", {"vcore": limit})
            other.reserve("root.dev", {"vcore": 1})  # moves forward to the new version
        assert ledger.config_version() == 4

        def seen_at(version: int) -> dict[str, int]:
            def step(tx: LedgerTx) -> dict[str, int]:
                tx.config_version = lambda: version  # type: ignore[method-assign]
                rules = other.rules.in_force(tx)
                assert rules.version == version
                return dict(rules.partition("default").queues["root.prod"].max)

            return other.driver.run(step)

        assert seen_at(2) == {"vcore": 2000}
        assert seen_at(1) == {"vcore": 20000}
        assert other.rules.compiles == compiled
        assert other.limits()["root.prod"] == {"vcore": 4000}
