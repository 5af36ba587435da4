"""Placement rules, checked as YuniKorn checks them (``checkPlacementRules`` in configvalidator.go).

The ledger places nothing itself: a caller names the queue. Placement rules are kept in the
configuration so that a YuniKorn file carries over unchanged, and they are validated so that a
file the ledger accepts is one YuniKorn accepts too:

- every rule (and every parent rule) has a name that is an identifier;
- a filter's type is "", ``allow`` or ``deny`` (any case);
- a filter that lists exactly one user (or group) lists a valid name or a regular expression
  that compiles and uses a regular-expression character (longer lists are taken as names and
  entries that are not names are ignored, as YuniKorn does);
- the fixed part of a rule chain (``fixed`` rules before the first other rule) must lead to a
  leaf queue, or to a parent queue when the chain goes on below it; queues it names that are
  not configured need ``create: true``, and cannot be created under a leaf.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quota_ledger.config.model import ROOT, Partition, PlacementRule, Queue
from quota_ledger.config.user_group_checks import GROUP_NAME, USER_NAME, Report

RULE_NAME = re.compile(r"[_a-zA-Z][a-zA-Z0-9_]*", re.ASCII)
#: a one-entry filter that is not a name must use one of these to count as a regular expression
_SPECIAL = re.compile(r"[\^$*+?()\[{}|]")
_FIXED = "fixed"


def check_placement_rules(report: Report, partition: Partition) -> None:
    """Every problem of the partition's placement rules (none when it has no rules)."""
    for number, rule in enumerate(partition.placementrules):
        valid = check_rule(report, rule, number)
        if valid:
            _check_static_path(report, partition, rule, number)


def check_rule(report: Report, rule: PlacementRule, number: int) -> bool:
    """YuniKorn's ``checkPlacementRule``: the names of the chain and the filters; True when valid."""
    ok = True
    if not RULE_NAME.fullmatch(rule.name):
        report.add(
            f"placement rule #{number}: rule name {rule.name!r} is not valid: it must start with a "
            "letter or '_' and contain only letters, digits and '_'"
        )
        ok = False
    if rule.parent is not None:
        ok = check_rule(report, rule.parent, number) and ok
    if rule.filter is not None:
        kind = rule.filter.type
        if kind and kind.lower() not in ("allow", "deny"):
            report.add(f"placement rule #{number}: filter type {kind!r} is not valid: use allow or deny")
            ok = False
        for what, names, pattern in (
            ("user", rule.filter.users, USER_NAME),
            ("group", rule.filter.groups, GROUP_NAME),
        ):
            if len(names) == 1 and not _name_or_regexp(names[0], pattern):
                report.add(
                    f"placement rule #{number}: filter {what} {names[0]!r} is neither a valid {what} "
                    "name nor a regular expression"
                )
                ok = False
    return ok


def _name_or_regexp(entry: str, pattern: re.Pattern[str]) -> bool:
    if pattern.fullmatch(entry):
        return True
    try:
        re.compile(entry)
    except re.error:
        return False
    return _SPECIAL.search(entry) is not None


@dataclass(frozen=True, slots=True)
class _StaticPath:
    path: str
    chain: str
    dynamic: bool


def _static_path(rule: PlacementRule) -> _StaticPath | str:
    """The longest fixed queue path of a rule chain (parents first), or a problem."""
    chain: list[PlacementRule] = []
    node: PlacementRule | None = rule
    while node is not None:
        chain.insert(0, node)
        node = node.parent
    path = ""
    dynamic = False
    for each in chain:
        if dynamic:
            continue
        if each.name != _FIXED:
            path = path or "<dynamic>"
            dynamic = True
            continue
        if each.value.startswith(ROOT):
            if path:
                return (
                    f"only the first 'fixed' rule of a chain may name a full queue path, not {each.value!r}"
                )
            path = each.value
            continue
        path = f"{path or ROOT}.{each.value}"
    return _StaticPath(path, "->".join(r.name for r in chain), dynamic)


def _check_static_path(report: Report, partition: Partition, rule: PlacementRule, number: int) -> None:
    found = _static_path(rule)
    if isinstance(found, str):
        report.add(f"placement rule #{number}: {found}")
        return
    if not found.path.startswith(ROOT):
        return
    parts = found.path.lower().split(".")
    problem = _walk(parts, rule.create, found.dynamic, partition.queues or (), None)
    if problem:
        report.add(f"placement rule #{number} ({found.chain}) names queue {found.path}, {problem}")


def _walk(
    path: list[str], create: bool, dynamic: bool, level: tuple[Queue, ...], parent: Queue | None
) -> str:
    """Why the fixed path cannot be used as written; "" when it can."""
    if not level:
        if parent is not None and not parent.parent:
            return f"which cannot be created: {parent.name} is a leaf queue"
        return "" if create else "which does not exist and the rule has create: false"
    queue = next((q for q in level if q.name == path[0]), None)
    if queue is None:
        return "" if create else "which does not exist and the rule has create: false"
    if len(path) == 1:
        if dynamic:
            return "" if queue.parent else "which must be a parent queue: the rule chain goes on below it"
        return "which is not a leaf queue" if queue.parent else ""
    return _walk(path[1:], create, dynamic, queue.queues, queue)
