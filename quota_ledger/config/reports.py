"""User and group usage in YuniKorn's REST shapes (``UserResourceUsageDAOInfo`` and friends).

Aggregated on read from the application rows: every queue level of every application's path,
whether or not a limit applies there. Resource usage is what counts against limits (in use plus
reserved), in base units; empty fields are omitted as YuniKorn's ``omitempty`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from quota_ledger.config.rules import WILDCARD, LimitRule, PartitionRules
from quota_ledger.model.queues import in_subtree, lineage
from quota_ledger.model.tracking import RUNNING, AppState


def visible(app: AppState) -> bool:
    """Tracked until nothing is left: something held, or a named application still running."""
    return bool(app.held()) or (app.counts and app.state == RUNNING)


def user_names(rules: PartitionRules, apps: Iterable[AppState]) -> list[str]:
    names = {a.user for a in apps if a.user is not None and visible(a)}
    names |= {u for q in rules.queues.values() for u in q.users if u != WILDCARD}
    return sorted(names)


def group_names(rules: PartitionRules, apps: Iterable[AppState]) -> list[str]:
    names = {a.group for a in apps if a.group is not None and visible(a)}
    names |= {g for q in rules.queues.values() for g in q.groups}
    return sorted(names)


def user_report(rules: PartitionRules, user: str, apps: Iterable[AppState]) -> dict[str, Any] | None:
    mine = [a for a in apps if a.user == user and visible(a)]
    configured = [q.path for q in rules.queues.values() if user in q.users]
    if not mine and not configured:
        return None
    report: dict[str, Any] = {"userName": user}
    groups = {a.application: a.group for a in mine if a.counts and a.state == RUNNING and a.group}
    if groups:
        report["groups"] = dict(sorted(groups.items()))
    tree = _tree(mine, lambda path: rules.user_rule(path, user), configured)
    if tree is not None:
        report["queues"] = tree
    return report


def group_report(rules: PartitionRules, group: str, apps: Iterable[AppState]) -> dict[str, Any] | None:
    mine = [a for a in apps if a.group == group and visible(a)]
    configured = [q.path for q in rules.queues.values() if group in q.groups]
    if not mine and not configured:
        return None
    report: dict[str, Any] = {"groupName": group}
    running = sorted(a.application for a in mine if a.application and a.state == RUNNING)
    if running:
        report["applications"] = running

    def limit_at(path: str) -> LimitRule | None:
        rule = rules.queues.get(path)
        return rule.groups.get(group) if rule is not None else None

    tree = _tree(mine, limit_at, configured)
    if tree is not None:
        report["queues"] = tree
    return report


def _tree(
    apps: list[AppState], limit_at: Callable[[str], LimitRule | None], configured: list[str]
) -> dict[str, Any] | None:
    paths = {p for a in apps for p in lineage(a.queue)} | {p for c in configured for p in lineage(c)}
    if not paths:
        return None
    nodes: dict[str, dict[str, Any]] = {}
    for path in sorted(paths):
        node: dict[str, Any] = {"queuePath": path}
        usage: dict[str, int] = {}
        for app in apps:
            if in_subtree(app.queue, path):
                for resource, (in_use, reserved) in app.held().items():
                    usage[resource] = usage.get(resource, 0) + in_use + reserved
        if usage := {k: v for k, v in sorted(usage.items()) if v}:
            node["resourceUsage"] = usage
        running = sorted(
            a.application for a in apps if a.application and a.state == RUNNING and in_subtree(a.queue, path)
        )
        if running:
            node["runningApplications"] = running
        if (rule := limit_at(path)) is not None:
            if rule.resources:
                node["maxResources"] = dict(sorted(rule.resources.items()))
            if rule.max_applications:
                node["maxApplications"] = rule.max_applications
        nodes[path] = node
    for path in sorted(paths, key=lambda p: (p.count("."), p)):
        if "." in path:
            nodes[path.rsplit(".", 1)[0]].setdefault("children", []).append(nodes[path])
    return nodes["root"]
