"""YuniKorn queue configuration, user and group limits, applications: on every backend."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from quota_ledger import (
    ApplicationNotFound,
    ConfigError,
    InvalidQuantity,
    InvalidRequest,
    OverQuota,
    QuotaEngine,
    UsageUnderflow,
    UserNotFound,
)

CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: dev
            resources:
              max: {vcore: 10, memory: 16Gi}
            maxapplications: 4
            limits:
              - limit: sue is special
                users: [sue]
                maxresources: {vcore: 6}
              - limit: everybody else
                users: ["*"]
                maxresources: {vcore: 2}
                maxapplications: 2
              - limit: dev group
                groups: [dev]
                maxresources: {vcore: 5}
              - limit: other groups
                groups: ["*"]
                maxresources: {vcore: 3}
            queues:
              - name: team1
                maxapplications: 4
                resources:
                  max: {vcore: 8}
                limits:
                  - users: [sue]
                    maxresources: {vcore: 4}
              - name: team2
                maxapplications: 4
          - name: prod
            resources:
              max: {vcore: 20}
"""


def _violations(error: pytest.ExceptionInfo[OverQuota]) -> set[tuple[str, str, str | None, str]]:
    return {(v.kind, v.scope, v.name, v.resource) for v in error.value.violations}


def test_apply_config_returns_versions_and_stores_the_normalized_config(ledger: QuotaEngine) -> None:
    assert ledger.config_version() == 0
    assert ledger.apply_config(CONFIG) == 1
    stored = ledger.config()
    assert stored["partitions"][0]["name"] == "default"
    dev = stored["partitions"][0]["queues"][0]["queues"][0]
    assert dev["name"] == "dev"
    assert dev["resources"]["max"] == {"vcore": "10", "memory": "16Gi"}
    assert ledger.apply_config(stored) == 1  # what config() returns applies again: no change
    assert ledger.limits()["root.dev"] == {"vcore": 10_000, "memory": 16 * 2**30, "applications": 4}


def test_apply_config_accepts_a_dict_and_a_path(ledger: QuotaEngine, tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(CONFIG)
    assert ledger.apply_config(path) == 1
    root_only = {"partitions": [{"name": "default", "queues": [{"name": "root"}]}]}
    assert ledger.apply_config(root_only, allow_removing_all=True) == 2
    assert ledger.limits() == {}


def test_invalid_config_lists_every_problem_and_changes_nothing(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    bad = """
partitions:
  - name: default
    queues:
      - name: root
        resources: {max: {vcore: 1}}
        queues:
          - name: a
            resources: {max: {vcore: 5}}
            queues:
              - name: b
                resources: {max: {vcore: 6}}
            limits:
              - users: []
"""
    problems = ledger.validate_config(bad)
    assert len(problems) == 4  # the empty limit breaks two rules
    assert {p.queue for p in problems} == {"root", "root.a", "root.a.b"}
    with pytest.raises(ConfigError) as refused:
        ledger.apply_config(bad)
    assert refused.value.problems == problems
    assert ledger.config_version() == 1
    assert ledger.limits()["root.dev.team1"] == {"vcore": 8000, "applications": 4}


def test_unknown_keys_and_bad_yaml_are_config_errors(ledger: QuotaEngine) -> None:
    with pytest.raises(ConfigError) as unknown:
        ledger.apply_config("partitions:\n  - name: default\n    queues: [{name: root, maxresources: {}}]\n")
    assert "maxresources" in str(unknown.value)
    with pytest.raises(ConfigError):
        ledger.apply_config("partitions: [")
    assert ledger.config_version() == 0


def test_queue_max_caps_the_subtree_and_dynamic_queues_inherit_it(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    ledger.reserve("root.prod.anything.deeper", {"vcore": "15"})
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.prod.other", {"vcore": "6"})
    assert _violations(refused) == {("queue", "root.prod", None, "vcore")}


def test_zero_max_blocks_the_resource(ledger: QuotaEngine) -> None:
    ledger.apply_config(
        {
            "partitions": [
                {
                    "name": "default",
                    "queues": [
                        {
                            "name": "root",
                            "queues": [{"name": "a", "resources": {"max": {"vcore": 0, "memory": 0}}}],
                        }
                    ],
                }
            ]
        }
    )
    with pytest.raises(OverQuota):
        ledger.reserve("root.a", {"vcore": "1m"})
    ledger.reserve("root.a", {"fpga": 1})  # a resource the max does not name is unlimited


def test_set_limits_edits_the_stored_config_and_validates(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    version = ledger.set_limits("root.prod", {"vcore": "30", "memory": "1Gi"})
    assert version == 2
    prod = ledger.config()["partitions"][0]["queues"][0]["queues"][1]
    assert prod["resources"]["max"] == {"vcore": "30000m", "memory": str(2**30)}
    with pytest.raises(ConfigError) as refused:
        ledger.set_limits("root.prod.small", {"vcore": "31"})  # above the parent's max
    assert refused.value.problems[0].queue == "root.prod.small"
    assert ledger.config_version() == 2
    ledger.set_limits("root", {"vcore": "25"})  # root's capacity, outside the YuniKorn document
    assert ledger.limits()["root"] == {"vcore": 25_000}
    assert "resources" not in ledger.config()["partitions"][0]["queues"][0]


def test_lowering_a_limit_below_usage_is_allowed_and_refuses_new_reservations(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    r = ledger.reserve("root.prod", {"vcore": "10"})
    ledger.commit(r.id)
    ledger.set_limits("root.prod", {"vcore": "5"})
    usage = ledger.usage("root.prod")["vcore"]
    assert (usage.in_use, usage.limit, usage.available) == (10_000, 5_000, -5_000)
    with pytest.raises(OverQuota):
        ledger.reserve("root.prod", {"vcore": "1m"})
    ledger.release("root.prod", {"vcore": "10"})
    ledger.reserve("root.prod", {"vcore": "5"})


def test_named_user_limit_wins_over_the_wildcard(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    ledger.reserve("root.dev.team2", {"vcore": "6"}, user="sue", application="s1")
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.dev.team2", {"vcore": "1"}, user="sue", application="s1")
    assert ("user", "root.dev", "sue", "vcore") in _violations(refused)


def test_user_wildcard_gives_each_user_their_own_copy(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    ledger.reserve("root.dev.team2", {"vcore": "2"}, user="bob", application="b1")
    ledger.reserve("root.dev.team2", {"vcore": "2"}, user="ann", application="a1")
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.dev.team2", {"vcore": "1"}, user="bob", application="b1")
    assert _violations(refused) == {("user", "root.dev", "bob", "vcore")}


def test_user_limits_hold_at_every_level(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    ledger.reserve("root.dev.team1", {"vcore": "4"}, user="sue", application="s1")
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.dev.team1", {"vcore": "1"}, user="sue", application="s1")
    assert _violations(refused) == {("user", "root.dev.team1", "sue", "vcore")}
    ledger.reserve("root.dev.team2", {"vcore": "2"}, user="sue", application="s2")  # 6 at root.dev


def test_group_limit_applies_to_the_first_configured_group_the_user_is_in(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    ledger.reserve("root.dev.team2", {"vcore": "2"}, user="bob", groups=["qa", "dev"], application="b1")
    ledger.reserve("root.dev.team2", {"vcore": "2"}, user="ann", groups=["dev"], application="a1")
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.dev.team2", {"vcore": "2"}, user="cat", groups=["dev"], application="c1")
    assert _violations(refused) == {("group", "root.dev", "dev", "vcore")}
    assert ledger.user_usage("bob")["groups"] == {"b1": "dev"}


def test_group_wildcard_is_one_shared_bucket_and_users_without_groups_bypass_it(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    ledger.reserve("root.dev.team2", {"vcore": "2"}, user="bob", groups=["qa"], application="b1")
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.dev.team2", {"vcore": "2"}, user="ann", groups=["ops"], application="a1")
    assert _violations(refused) == {("group", "root.dev", "*", "vcore")}
    ledger.reserve("root.dev.team2", {"vcore": "2"}, user="ann", application="a1")  # no groups
    assert ledger.group_usage("*")["queues"]["resourceUsage"] == {"vcore": 2000}
    assert "groups" not in ledger.user_usage("ann")


def test_a_lower_group_wildcard_wins_over_a_named_group_higher_up(ledger: QuotaEngine) -> None:
    # The design's accepted side effect: the walk starts at the leaf and stops at the first match.
    ledger.apply_config(
        """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: p
            limits:
              - {groups: [dev], maxresources: {vcore: 1}}
            queues:
              - name: c
                limits:
                  - {groups: [ops], maxresources: {vcore: 100}}
                  - {groups: ["*"], maxresources: {vcore: 100}}
"""
    )
    ledger.reserve("root.p.c", {"vcore": "5"}, user="sue", groups=["dev"], application="x")
    assert ledger.user_usage("sue")["groups"] == {"x": "*"}
    with pytest.raises(OverQuota):  # in root.p (no wildcard there) the named group applies
        ledger.reserve("root.p", {"vcore": "2"}, user="sue", groups=["dev"], application="y")


def test_queue_maxapplications_counts_running_applications(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    for app in ("a1", "a2", "a3", "a4"):
        ledger.reserve("root.dev.team2", {"memory": "1"}, application=app)
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.dev.team2", {"memory": "1"}, application="a5")
    assert _violations(refused) == {
        ("queue", "root.dev", None, "applications"),
        ("queue", "root.dev.team2", None, "applications"),
    }
    ledger.reserve("root.dev.team2", {"memory": "1"}, application="a1")  # running: never refused
    ledger.release("root.dev.team2", {}, application="a2", finished=True)
    ledger.reserve("root.dev.team2", {"memory": "1"}, application="a5")


def test_user_maxapplications_and_rollback_ends_an_idle_application(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    first = ledger.reserve("root.dev.team2", {"memory": "1"}, user="bob", application="b1")
    ledger.reserve("root.dev.team2", {"memory": "1"}, user="bob", application="b2")
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.dev.team2", {"memory": "1"}, user="bob", application="b3")
    assert _violations(refused) == {("user", "root.dev", "bob", "applications")}
    ledger.reserve("root.dev.team2", {"memory": "1"}, user="ann", application="a1")  # her own copy
    ledger.rollback(first.id)  # b1's last reservation, nothing in use: b1 stops running
    ledger.reserve("root.dev.team2", {"memory": "1"}, user="bob", application="b3")
    assert ledger.application_summary("b1")["state"] == "RolledBack"


def test_group_maxapplications(ledger: QuotaEngine) -> None:
    ledger.apply_config(
        """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: q
            limits:
              - {groups: [dev], maxapplications: 1}
"""
    )
    ledger.reserve("root.q", {"memory": "1"}, user="a", groups=["dev"], application="x")
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.q", {"memory": "1"}, user="b", groups=["dev"], application="y")
    assert _violations(refused) == {("group", "root.q", "dev", "applications")}
    ledger.reserve("root.q", {"memory": "1"}, user="b", groups=["other"], application="y")


def test_expiry_ends_an_idle_application(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    ledger.reserve("root.dev.team2", {"memory": "1"}, user="bob", application="b1", ttl=0.05)
    ledger.reserve("root.dev.team2", {"memory": "1"}, user="bob", application="b2")
    time.sleep(0.1)
    assert ledger.expire() == 1
    ledger.reserve("root.dev.team2", {"memory": "1"}, user="bob", application="b3")
    assert ledger.application_summary("b1")["state"] == "Expired"
    assert ledger.audit() == []


def test_user_usage_has_yunikorns_shape(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    r = ledger.reserve(
        "root.dev.team1", {"vcore": "1", "memory": "1Gi"}, user="sue", groups=["dev"], application="s1"
    )
    ledger.commit(r.id)
    ledger.reserve("root.dev.team2", {"vcore": "500m"}, user="sue", groups=["dev"], application="s2")
    report = ledger.user_usage("sue")
    assert report["userName"] == "sue"
    assert report["groups"] == {"s1": "dev", "s2": "dev"}
    root = report["queues"]
    assert root["queuePath"] == "root"
    assert root["resourceUsage"] == {"memory": 2**30, "vcore": 1500}
    assert root["runningApplications"] == ["s1", "s2"]
    assert "maxResources" not in root
    (dev,) = root["children"]
    assert dev["maxResources"] == {"vcore": 6000}
    team1, team2 = sorted(dev["children"], key=lambda n: n["queuePath"])
    assert team1 == {
        "queuePath": "root.dev.team1",
        "resourceUsage": {"memory": 2**30, "vcore": 1000},
        "runningApplications": ["s1"],
        "maxResources": {"vcore": 4000},
    }
    assert team2 == {
        "queuePath": "root.dev.team2",
        "resourceUsage": {"vcore": 500},
        "runningApplications": ["s2"],
    }
    group = ledger.group_usage("dev")
    assert group["groupName"] == "dev"
    assert group["applications"] == ["s1", "s2"]
    assert group["queues"]["children"][0]["maxResources"] == {"vcore": 5000}


def test_usage_disappears_when_nothing_is_left_but_configured_users_stay(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    r = ledger.reserve("root.dev.team2", {"vcore": "1"}, user="bob", application="b1")
    assert [u["userName"] for u in ledger.user_usages()] == ["bob", "sue"]
    ledger.rollback(r.id)
    with pytest.raises(UserNotFound):
        ledger.user_usage("bob")
    sue = ledger.user_usage("sue")  # configured: visible with her limits and no usage
    assert "resourceUsage" not in sue["queues"]
    assert sue["queues"]["children"][0]["maxResources"] == {"vcore": 6000}


def test_application_summary_integrates_usage_over_time(
    ledger: QuotaEngine, caplog: pytest.LogCaptureFixture
) -> None:
    r = ledger.reserve("root.a", {"vcore": "100m", "memory": "500M"}, user="sue", application="app-1")
    ledger.commit(r.id)
    time.sleep(0.3)
    with caplog.at_level(logging.INFO, logger="quota_ledger.summary"):
        ledger.release(
            "root.a", {"vcore": "100m", "memory": "500M"}, user="sue", application="app-1", finished=True
        )
    summary = ledger.application_summary("app-1")
    seconds = (summary["finishTime"] - summary["startTime"]) / 1000
    assert seconds >= 0.3
    assert abs(summary["resourceUsage"]["vcore"] - 100 * seconds) <= 1
    assert abs(summary["resourceUsage"]["memory"] - 500_000_000 * seconds) <= 500_000_000 / 1000
    assert (summary["appId"], summary["user"], summary["queue"], summary["state"]) == (
        "app-1",
        "sue",
        "root.a",
        "Completed",
    )
    assert summary["submissionTime"] <= summary["startTime"] <= summary["finishTime"]
    lines = [m for m in caplog.messages if m.startswith("QUOTA_APP_SUMMARY: ")]
    assert len(lines) == 1
    assert '"appId":"app-1"' in lines[0]
    with pytest.raises(ApplicationNotFound):
        ledger.application_summary("never-ran")


def test_an_application_belongs_to_one_user_and_queue(ledger: QuotaEngine) -> None:
    ledger.reserve("root.a", {"vcore": "1"}, user="sue", application="x")
    with pytest.raises(InvalidRequest) as refused:
        ledger.reserve("root.a", {"vcore": "1"}, user="bob", application="x")
    assert refused.value.field == "application"
    with pytest.raises(InvalidRequest):
        ledger.reserve("root.b", {"vcore": "1"}, user="sue", application="x")


def test_release_by_user_cannot_release_more_than_the_user_holds(ledger: QuotaEngine) -> None:
    r = ledger.reserve("root.a", {"vcore": "2"}, user="sue")
    ledger.commit(r.id)
    ledger.reserve("root.a", {"vcore": "2"})
    with pytest.raises(UsageUnderflow):
        ledger.release("root.a", {"vcore": "1"}, user="bob")
    ledger.release("root.a", {"vcore": "2"}, user="sue")
    assert ledger.audit() == []


def test_config_change_recomputes_user_and_group_counters(ledger: QuotaEngine) -> None:
    ledger.reserve("root.dev.team2", {"vcore": "3"}, user="bob", groups=["dev"], application="b1")
    ledger.apply_config(CONFIG)  # bob already holds 3 vcore: over his wildcard limit of 2
    with pytest.raises(OverQuota) as refused:
        ledger.reserve("root.dev.team2", {"vcore": "1m"}, user="bob", groups=["dev"], application="b1")
    assert ("user", "root.dev", "bob", "vcore") in _violations(refused)
    assert ledger.audit() == []
    ledger.apply_config(CONFIG)  # re-applying the same config keeps usage (YUNIKORN-2012)
    assert ledger.user_usage("bob")["queues"]["resourceUsage"] == {"vcore": 3000}
    assert ledger.audit() == []


def _namespace(name: str, **annotations: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "annotations": annotations}}


def test_namespace_quota_annotation_sets_the_queue_max(ledger: QuotaEngine) -> None:
    quota = '{"cpu": "2", "memory": "1G", "nvidia.com/gpu": "1"}'
    assert ledger.apply_namespace(
        _namespace("finance", **{"yunikorn.apache.org/namespace.quota": quota})
    ) == ("root.finance")
    assert ledger.namespace_queue("finance") == "root.finance"
    assert ledger.limits()["root.finance"] == {"vcore": 2000, "memory": 10**9, "nvidia.com/gpu": 1}
    with pytest.raises(OverQuota):
        ledger.reserve(ledger.namespace_queue("finance"), {"nvidia.com/gpu": 2})
    ledger.apply_namespace(_namespace("finance"))  # quota annotation removed: max removed
    assert "root.finance" not in ledger.limits()


def test_namespace_parent_annotation_and_deprecated_max(ledger: QuotaEngine) -> None:
    ledger.apply_config(CONFIG)
    manifest = """
apiVersion: v1
kind: Namespace
metadata:
  name: sales
  annotations:
    yunikorn.apache.org/parentqueue: prod
    yunikorn.apache.org/namespace.max.cpu: "3"
    yunikorn.apache.org/namespace.max.memory: 1Gi
"""
    assert ledger.apply_namespace(manifest) == "root.prod.sales"
    assert ledger.limits()["root.prod.sales"] == {"vcore": 3000, "memory": 2**30}
    assert ledger.namespace_queue("unplaced") == "root.unplaced"
    with pytest.raises(InvalidRequest):
        ledger.apply_namespace(_namespace("Bad_Name"))
    with pytest.raises(InvalidRequest):
        ledger.apply_namespace(_namespace("x", **{"yunikorn.apache.org/namespace.quota": "{not json"}))
    with pytest.raises(ConfigError):  # a namespace quota above its parent's max
        ledger.apply_namespace(
            _namespace(
                "big",
                **{
                    "yunikorn.apache.org/parentqueue": "root.prod",
                    "yunikorn.apache.org/namespace.max.cpu": "21",
                },
            )
        )


def test_applications_is_not_a_resource_anyone_may_reserve(ledger: QuotaEngine) -> None:
    with pytest.raises(InvalidQuantity) as refused:
        ledger.reserve("root.a", {"applications": 1}, application="x")
    assert refused.value.resource == "applications"
    with pytest.raises(InvalidRequest):
        ledger.set_limits("root.a", {"applications": 1})
    assert ledger.user_usages() == []
