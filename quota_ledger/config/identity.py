"""What user, group and application-count counters must hold: pure, from application rows.

Used when a configuration is applied (every counter is recomputed under the exclusive
partition lock), when a user's wildcard counter is first needed, and by the audit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from quota_ledger.config.rules import GROUP, USER, WILDCARD, PartitionRules
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.queues import in_subtree
from quota_ledger.model.tracking import RUNNING, AppState

#: (kind, name, queue, resource)
Key = tuple[str, str, str, str]


def belongs(app: AppState, kind: str, name: str) -> bool:
    return (app.user if kind == USER else app.group) == name


def totals(apps: Iterable[AppState], kind: str, name: str, queue: str) -> dict[str, tuple[int, int]]:
    """resource -> (in_use, reserved) of ``name``'s applications below ``queue``, with the
    running-application count under ``applications``."""
    found: dict[str, tuple[int, int]] = {}
    running = 0
    for app in apps:
        if not belongs(app, kind, name) or not in_subtree(app.queue, queue):
            continue
        for resource, (in_use, reserved) in app.held().items():
            have = found.get(resource, (0, 0))
            found[resource] = (have[0] + in_use, have[1] + reserved)
        if app.counts and app.state == RUNNING:
            running += 1
    if running:
        found[APPLICATIONS] = (running, 0)
    return found


def value(apps: Iterable[AppState], key: Key) -> tuple[int, int]:
    kind, name, queue, resource = key
    return totals(apps, kind, name, queue).get(resource, (0, 0))


def desired(rules: PartitionRules, apps: Iterable[AppState]) -> dict[Key, int]:
    """Every user/group counter the configuration enforces, with its limit.

    Named users and groups (and the shared group ``*``) get theirs at once; a user wildcard
    gets one copy per user that has something tracked below that queue; other users get
    their copy when they first reserve there.
    """
    app_list = list(apps)
    found: dict[Key, int] = {}
    for rule in rules.queues.values():
        for name, limit in rule.users.items():
            if name != WILDCARD:
                for resource, value_ in limit.counters().items():
                    found[(USER, name, rule.path, resource)] = value_
        if (wildcard := rule.users.get(WILDCARD)) is not None:
            users = {a.user for a in app_list if a.user is not None and in_subtree(a.queue, rule.path)}
            for user in users - set(rule.users):
                for resource, value_ in wildcard.counters().items():
                    found[(USER, user, rule.path, resource)] = value_
        for name, limit in rule.groups.items():
            for resource, value_ in limit.counters().items():
                found[(GROUP, name, rule.path, resource)] = value_
    return found


def queue_app_counts(apps: Iterable[AppState]) -> dict[str, int]:
    """queue -> running named applications placed exactly there."""
    counts: dict[str, int] = {}
    for app in apps:
        if app.counts and app.state == RUNNING:
            counts[app.queue] = counts.get(app.queue, 0) + 1
    return counts


def subtree_count(counts: Mapping[str, int], queue: str) -> int:
    return sum(n for q, n in counts.items() if in_subtree(q, queue))
