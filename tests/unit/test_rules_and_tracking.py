"""Limit resolution (group selection walk, named over wildcard) and application arithmetic."""

from __future__ import annotations

from datetime import datetime, timedelta

from quota_ledger.config import load
from quota_ledger.config.model import normalize
from quota_ledger.config.rules import LimitRule, compile_config
from quota_ledger.model import tracking

CONFIG = """
partitions:
  - name: default
    queues:
      - name: root
        limits:
          - {users: [sue, "*"], groups: [ops], maxresources: {vcore: 100}}
        queues:
          - name: p
            limits:
              - {groups: [dev, qa], maxresources: {memory: 10}}
              - {groups: ["*"], maxresources: {memory: 5}}
            queues:
              - name: c
                limits:
                  - {users: [bob], maxresources: {memory: 3}}
"""


def _rules():  # type: ignore[no-untyped-def]
    return compile_config(normalize(load(CONFIG)), {}, 1).partition("default")


def test_group_selection_walks_from_the_leaf_up_in_config_order() -> None:
    rules = _rules()
    assert rules.select_group("root.p.c", ["qa", "dev"]) == "dev"  # config order, not the user's
    assert rules.select_group("root.p.c.dynamic", ["zzz"]) == "*"  # wildcard at root.p
    assert rules.select_group("root.other", ["ops"]) == "ops"
    assert rules.select_group("root.other", ["dev"]) is None
    assert rules.select_group("root.p", []) is None  # no groups, no group tracking


def test_named_user_wins_over_wildcard_and_limits_apply_at_every_level() -> None:
    rules = _rules()
    scopes = rules.identity_scopes("root.p.c", "bob", "dev")
    assert [(s.kind, s.name, s.queue) for s in scopes] == [
        ("user", "bob", "root"),
        ("group", "dev", "root.p"),
        ("user", "bob", "root.p.c"),
    ]
    assert scopes[0].rule == LimitRule({"vcore": 100_000})  # bob gets the wildcard's copy at root
    assert rules.user_rule("root", "sue") == LimitRule({"vcore": 100_000})
    assert rules.user_rule("root.p", "sue") is None


def test_queue_limits_include_capacity_and_maxapplications() -> None:
    config = normalize(
        load(
            {
                "partitions": [
                    {
                        "queues": [
                            {
                                "name": "root",
                                "queues": [
                                    {
                                        "name": "a",
                                        "maxapplications": 3,
                                        "resources": {"max": {"vcore": "500m", "memory": 0}},
                                    }
                                ],
                            }
                        ]
                    }
                ]
            }
        )
    )
    rules = compile_config(config, {"default": {"fpga": 2}}, 7).partition("default")
    assert rules.queue_limits() == {
        ("root", "fpga"): 2,
        ("root.a", "vcore"): 500,
        ("root.a", "memory"): 0,
        ("root.a", "applications"): 3,
    }


def test_usage_is_integrated_over_time_100m_for_30s_is_3000() -> None:
    t0 = datetime(2026, 1, 1, 12, 0, 0)
    app = tracking.new_app("default", "app-1", "sue", "root.a", None, t0)
    tracking.add_reserved(app, {"vcore": 100, "memory": 500_000_000})
    tracking.resolve(app, {"vcore": 100, "memory": 500_000_000}, {"vcore": 100, "memory": 500_000_000}, t0)
    tracking.release(app, {"memory": 500_000_000}, t0 + timedelta(seconds=10))
    summary = tracking.finish(app, t0 + timedelta(seconds=30), "Completed")
    assert summary is not None
    assert summary["resourceUsage"] == {"memory": 5_000_000_000, "vcore": 3000}
    assert summary["finishTime"] - summary["startTime"] == 30_000
    assert tracking.finish(app, t0 + timedelta(seconds=40), "Completed") is None  # only once


def test_a_clock_going_backwards_adds_nothing() -> None:
    t0 = datetime(2026, 1, 1)
    app = tracking.new_app("default", "x", None, "root", None, t0)
    tracking.add_reserved(app, {"vcore": 1})
    tracking.resolve(app, {"vcore": 1}, {"vcore": 1}, t0)
    tracking.advance(app, t0 - timedelta(seconds=5))
    assert app.area == {}
    assert app.changed_at == t0


def test_a_users_bucket_never_counts_as_an_application() -> None:
    bucket = tracking.new_app("default", None, "sue", "root.a", None, datetime(2026, 1, 1))
    assert not bucket.counts
    assert not bucket.started_now
    assert bucket.app_key == "\tsue\troot.a"
