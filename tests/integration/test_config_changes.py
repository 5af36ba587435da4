"""Configuration changes are reviewable and safe: a dry run (diff_config), no version for an
identical configuration, a confirmation before every limit of a partition goes, and what
config() returns goes back in unchanged. On every backend."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import URL

from quota_ledger import ConfigError, InvalidRequest, OverQuota, QuotaEngine, RemovesAllLimits
from quota_ledger.config.diff import LimitChange, OverLimit

GI = 2**30
CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            maxapplications: 4
            resources: {max: {vcore: 10, memory: 16Gi}}
            limits:
              - limit: everyone
                users: ["*"]
                maxresources: {vcore: 4}
              - limit: the dev group
                groups: [dev]
                maxresources: {memory: 8Gi}
          - name: prod
            resources: {max: {vcore: 20}}
"""


@pytest.fixture
def ledger(db_url: URL) -> Iterator[QuotaEngine]:
    engine = QuotaEngine.from_url(db_url)
    assert engine.apply_config(CONFIG) == 1
    yield engine
    engine.close()


def changed(text: str) -> str:
    """CONFIG with prod's vcore lowered to 8, root.dev's wildcard user limit to 1 vcore, the
    group limit gone and a new queue root.test."""
    edited = (
        text.replace("max: {vcore: 20}", "max: {vcore: 8}")
        .replace("maxresources: {vcore: 4}", "maxresources: {vcore: 1}")
        .replace(
            """              - limit: the dev group
                groups: [dev]
                maxresources: {memory: 8Gi}
""",
            "",
        )
    )
    return edited + "          - name: test\n            resources: {max: {memory: 1Gi}}\n"


def test_reapplying_the_same_configuration_makes_no_version(ledger: QuotaEngine) -> None:
    assert ledger.apply_config(CONFIG) == 1
    assert ledger.apply_config(ledger.config()) == 1
    assert ledger.config_version() == 1
    assert ledger.diff_config(CONFIG).identical
    assert ledger.apply_config(changed(CONFIG)) == 2


def test_what_config_returns_goes_back_in_unchanged(ledger: QuotaEngine) -> None:
    envelope = {"version": ledger.config_version(), "config": ledger.config()}
    assert ledger.validate_config(envelope) == []
    assert ledger.apply_config(envelope) == 1
    assert ledger.diff_config(envelope).identical
    text = json.dumps(envelope)  # `quota-ledger config show --json`, saved to a file
    assert ledger.apply_config(text) == 1


def test_the_diff_lists_added_removed_and_changed_limits_and_changes_nothing(ledger: QuotaEngine) -> None:
    before = ledger.limits()
    found = ledger.diff_config(changed(CONFIG))
    assert found.version == 1
    assert not found.identical
    assert found.added == (
        LimitChange(
            partition="default",
            kind="queue",
            name=None,
            queue="root.test",
            resource="memory",
            old=None,
            new=GI,
        ),
    )
    assert found.removed == (
        LimitChange(
            partition="default",
            kind="group",
            name="dev",
            queue="root.dev",
            resource="memory",
            old=8 * GI,
            new=None,
        ),
    )
    assert {(c.kind, c.name, c.queue, c.resource, c.old, c.new) for c in found.changed} == {
        ("user", "*", "root.dev", "vcore", 4000, 1000),
        ("queue", None, "root.prod", "vcore", 20000, 8000),
    }
    assert found.over_limit == ()
    assert found.removes_all_limits == ()
    assert ledger.config_version() == 1
    assert ledger.limits() == before


def test_the_diff_names_every_queue_user_and_group_that_would_be_over(ledger: QuotaEngine) -> None:
    ledger.reserve("root.prod", {"vcore": 10})
    ledger.reserve("root.dev", {"vcore": 3, "memory": "6Gi"}, user="sue", groups=["dev"], application="a1")
    ledger.commit(ledger.reserve("root.dev", {"vcore": 1}, user="bob", application="b1").id)
    lowered = changed(CONFIG).replace("maxapplications: 4", "maxapplications: 1")
    found = ledger.diff_config(lowered)
    over = {(o.kind, o.name, o.queue, o.resource): o for o in found.over_limit}
    assert over[("queue", None, "root.prod", "vcore")] == OverLimit(
        partition="default",
        kind="queue",
        name=None,
        queue="root.prod",
        resource="vcore",
        in_use=0,
        reserved=10000,
        limit=8000,
        old_limit=20000,
    )
    assert over[("user", "sue", "root.dev", "vcore")].reserved == 3000
    assert over[("queue", None, "root.dev", "applications")].in_use == 2
    assert ("user", "bob", "root.dev", "vcore") not in over  # 1 vcore in use: at the limit, not over
    assert set(over) == {
        ("queue", None, "root.prod", "vcore"),
        ("user", "sue", "root.dev", "vcore"),
        ("queue", None, "root.dev", "applications"),
    }
    # Lowering below usage is allowed, as the diff said: nothing evicted, new requests refused.
    assert ledger.apply_config(lowered) == 2
    with pytest.raises(OverQuota):
        ledger.reserve("root.prod", {"vcore": 1})


def test_removing_every_limit_of_a_partition_needs_a_confirmation(ledger: QuotaEngine) -> None:
    assert ledger.diff_config("partitions: []").removes_all_limits == ("default",)
    with pytest.raises(RemovesAllLimits) as refused:
        ledger.apply_config("partitions: []")
    assert refused.value.partitions == ["default"]
    assert ledger.config_version() == 1
    assert ledger.limits()["root.prod"] == {"vcore": 20000}
    assert ledger.apply_config("partitions: []", allow_removing_all=True) == 2
    assert ledger.limits() == {}
    # Nothing left to remove: an empty configuration needs no confirmation any more.
    assert ledger.apply_config("partitions: []") == 2


def test_a_partition_that_keeps_one_limit_needs_no_confirmation(ledger: QuotaEngine) -> None:
    only_prod = CONFIG.split("          - name: dev", maxsplit=1)[0] + "          - name: prod\n"
    only_prod += "            resources: {max: {vcore: 2}}\n"
    assert ledger.apply_config(only_prod) == 2
    assert ledger.limits() == {"root.prod": {"vcore": 2000}}


def test_an_invalid_configuration_is_refused_by_the_diff_as_by_apply(ledger: QuotaEngine) -> None:
    with pytest.raises(ConfigError):
        ledger.diff_config(CONFIG.replace("vcore: 20", "vcore: lots"))
    with pytest.raises(InvalidRequest):
        ledger.apply_config(CONFIG, allow_removing_all="yes")  # type: ignore[arg-type]


def test_a_reservation_without_resources_is_refused(ledger: QuotaEngine) -> None:
    with pytest.raises(InvalidRequest) as refused:
        ledger.reserve("root.dev", {})
    assert refused.value.field == "resources"
    assert all(u.in_use == u.reserved == 0 for u in ledger.usage("root.dev").values())
