"""YuniKorn's user and group limit checks, and the resource arithmetic validation shares.

Two kinds of check (``pkg/common/configs/configvalidator.go``):

- within one queue (``checkLimit``): names, ordering of wildcards, the values of each limit
  against the queue's own ``maxapplications`` and ``max``;
- down the hierarchy (``checkLimitResource``, ``checkLimitMaxApplications``): a user's or
  group's limit must fit what the same name, or failing that the wildcard, got further up.

The checks are YuniKorn's; the messages are the ledger's own, with quantities as a person
writes them (``memory 8Gi, vcore 4``). Unlike YuniKorn, every problem is reported, not only the
first, and each once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from quota_ledger.config.amounts import describe_error, parse_config_resources
from quota_ledger.config.model import Limit, Queue
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.quantity import format_quantity
from quota_ledger.model.values import ConfigProblem

WILDCARD = "*"
USER_NAME = re.compile(r"[_a-zA-Z][a-zA-Z0-9:#/_.@-]*[$]?", re.ASCII)
GROUP_NAME = re.compile(r"[_a-zA-Z][a-zA-Z0-9:_.-]*", re.ASCII)
ONLY_WILDCARD_GROUP = (
    "the only group limit is the wildcard '*': a queue with a group wildcard needs at least "
    "one limit that names a group"
)
USER_NAME_RULE = (
    "it must start with a letter or '_' and contain only letters, digits and : # / _ . @ - "
    "(a final $ is allowed)"
)
GROUP_NAME_RULE = "it must start with a letter or '_' and contain only letters, digits and : _ . -"

Resources = dict[str, int]


# -- resources, with YuniKorn's comparison rules (pkg/common/resources/resources.go) ------------


def human(resource: Mapping[str, int] | None) -> str:
    """A resource as a person writes it, keys sorted: ``memory 8Gi, vcore 4`` (vcore in cores)."""
    if not resource:
        return "nothing"
    return ", ".join(f"{k} {format_quantity(k, v)}" for k, v in sorted(resource.items()))


def fit_in_max_undef(maximum: Mapping[str, int] | None, resource: Mapping[str, int] | None) -> bool:
    """Whether ``resource`` fits ``maximum``, a type missing from ``maximum`` being unlimited."""
    if maximum is None or resource is None:
        return True
    return all(v <= max(0, maximum[t]) for t, v in resource.items() if t in maximum)


def component_wise_min(a: Mapping[str, int] | None, b: Mapping[str, int] | None) -> Resources:
    """The smaller value of each type in both; a type in only one side keeps its value."""
    merged = dict(a or {})
    for t, v in (b or {}).items():
        merged[t] = min(merged[t], v) if t in merged else v
    return merged


def add(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    """The sum of each type (a type in only one side keeps its value)."""
    total = dict(a)
    for t, v in b.items():
        total[t] = total.get(t, 0) + v
    return total


def is_zero(resource: Mapping[str, int]) -> bool:
    """Empty or all values 0."""
    return all(v == 0 for v in resource.values())


def strictly_greater_than_zero(resource: Mapping[str, int]) -> bool:
    """At least one value above 0 and none below; an empty resource is not."""
    return any(v > 0 for v in resource.values()) and all(v >= 0 for v in resource.values())


def parse_map(values: Mapping[str, str] | None) -> tuple[Resources, list[str]]:
    """The parsed entries of a configured resource map, and one message per entry that failed."""
    parsed: Resources = {}
    errors: list[str] = []
    for name, text in (values or {}).items():
        try:
            parsed.update(parse_config_resources({name: text}))
        except InvalidRequest as exc:
            errors.append(describe_error(exc))
    return dict(sorted(parsed.items())), errors


# -- reporting -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Report:
    """The problems found in one partition, in the order YuniKorn would meet them."""

    partition: str
    problems: list[ConfigProblem] = field(default_factory=list)

    def add(self, message: str, *, queue: str = "", limit: str = "") -> None:
        self.problems.append(
            ConfigProblem(partition=self.partition, queue=queue, limit=limit, message=message)
        )


def limit_label(limit: Limit, name: str = "") -> str:
    """How a problem names a limit: its description, else the name concerned, else all its names."""
    return limit.limit or name or ",".join((*limit.users, *limit.groups))


def queue_max(queue: Queue) -> Mapping[str, str] | None:
    """The queue's configured max, as written (None when not set)."""
    return queue.resources.max if queue.resources is not None else None


def reports_queue_max_errors(queue: Queue, *, is_root: bool) -> bool:
    """Whether :func:`check_queue_limits` reports ``queue``'s unparsable max (so no one else does)."""
    return bool(queue.limits) and not is_root


# -- within one queue (checkLimits / checkLimit) ---------------------------------------------------


def check_queue_limits(report: Report, queue: Queue, path: str, *, is_root: bool) -> None:
    """YuniKorn's ``checkLimits`` for the limits of one queue (names seen are shared by all)."""
    if not queue.limits:
        return
    maximum: Resources | None = None
    if reports_queue_max_errors(queue, is_root=is_root):
        maximum, errors = parse_map(queue_max(queue))
        for error in errors:
            report.add(f"the queue's max is invalid: {error}", queue=path)
        if errors:
            maximum = None  # treated as not set, as for every later check
    users: set[str] = set()
    groups: set[str] = set()
    only_wildcard_reported = False
    for limit in queue.limits:
        if not limit.users and not limit.groups:
            report.add("the limit names no user and no group", queue=path, limit=limit_label(limit))
        _check_names(report, path, limit, "user", limit.users, users, USER_NAME)
        _check_names(report, path, limit, "group", limit.groups, groups, GROUP_NAME)
        if groups == {WILDCARD} and not only_wildcard_reported:
            report.add(ONLY_WILDCARD_GROUP, queue=path, limit=limit_label(limit))
            only_wildcard_reported = True
        _check_values(report, path, limit, queue, maximum)


def _check_names(
    report: Report,
    path: str,
    limit: Limit,
    kind: str,
    names: tuple[str, ...],
    seen: set[str],
    pattern: re.Pattern[str],
) -> None:
    rule = USER_NAME_RULE if kind == "user" else GROUP_NAME_RULE
    for name in names:
        label = limit.limit or name
        if name != WILDCARD and not pattern.fullmatch(name):
            report.add(f"{kind} name '{name}' is not valid: {rule}", queue=path, limit=label)
            continue
        if name in seen:
            report.add(
                f"{kind} '{name}' is named by more than one limit of this queue", queue=path, limit=label
            )
            continue
        seen.add(name)
        # The wildcard must be the last name of its kind across all limits of the queue.
        if WILDCARD in seen and name != WILDCARD:
            report.add(
                f"{kind} '{name}' comes after the {kind} wildcard '*': the wildcard must be the "
                f"last {kind} of the queue's limits",
                queue=path,
                limit=label,
            )


def _check_values(report: Report, path: str, limit: Limit, queue: Queue, maximum: Resources | None) -> None:
    label = limit_label(limit)
    resources: Resources | None = {}
    if limit.maxresources:
        resources, errors = parse_map(limit.maxresources)
        for error in errors:
            report.add(error, queue=path, limit=label)
        if errors:
            resources = None
        elif not strictly_greater_than_zero(resources):
            message = "maxresources must have at least one amount above zero and none below"
            report.add(message, queue=path, limit=label)
    elif limit.maxapplications == 0:
        report.add("the limit sets neither maxresources nor maxapplications", queue=path, limit=label)
    if queue.maxapplications != 0 and queue.maxapplications < limit.maxapplications:
        report.add(
            f"maxapplications {limit.maxapplications} is more than the queue's maxapplications "
            f"{queue.maxapplications}",
            queue=path,
            limit=label,
        )
    if maximum is not None and resources is not None and not fit_in_max_undef(maximum, resources):
        report.add(
            f"maxresources ({human(resources)}) is more than the queue's max ({human(maximum)})",
            queue=path,
            limit=label,
        )


# -- down the hierarchy (checkLimitResource / checkLimitMaxApplications) -------------------------


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Carried(Generic[_T]):
    """What each user and group name (``*`` included) got from the queues above: name -> value."""

    users: dict[str, _T]
    groups: dict[str, _T]


def check_limit_hierarchy(report: Report, root: Queue, root_path: str) -> None:
    """Every limit must fit the same name's limit above it, else the wildcard's above it.

    Resources first, then maxapplications, as YuniKorn orders them. What a queue passes down
    is what it got plus its own limits, so a queue without limits passes its parent's through
    and siblings do not see each other's.
    """
    _walk_resources(report, root, root_path, _Carried({}, {}))
    _walk_applications(report, root, root_path, _Carried({}, {}))


def _limit_resources(limit: Limit) -> Resources:
    # An unparsable maxresources was reported by check_queue_limits; here it limits nothing.
    resources, errors = parse_map(limit.maxresources)
    return {} if errors else resources


def _walk_resources(report: Report, queue: Queue, path: str, above: _Carried[Resources]) -> None:
    mine = _Carried(dict(above.users), dict(above.groups))
    for limit in queue.limits:
        value = _limit_resources(limit)
        for kind, names, got, passed in (
            ("user", limit.users, above.users, mine.users),
            ("group", limit.groups, above.groups, mine.groups),
        ):
            for name in filter(None, names):
                head = f"maxresources of {kind} '{name}' ({human(value)}) is more than"
                if name in got:
                    if not fit_in_max_undef(got[name], value):
                        report.add(
                            f"{head} the limit for '{name}' on a parent queue ({human(got[name])})",
                            queue=path,
                            limit=limit.limit or name,
                        )
                    passed[name] = component_wise_min(value, got[name])
                elif name != WILDCARD and WILDCARD in got:
                    wildcard = got[WILDCARD]
                    if fit_in_max_undef(wildcard, value):
                        passed[name] = value
                    else:
                        report.add(
                            f"{head} the {kind} wildcard's limit on a parent queue ({human(wildcard)})",
                            queue=path,
                            limit=limit.limit or name,
                        )
                        passed[name] = component_wise_min(value, wildcard)
                else:
                    passed[name] = value
    for child in queue.queues:
        _walk_resources(report, child, f"{path}.{child.name}", mine)


def _too_many(above: int, value: int) -> bool:
    return above != 0 and (above < value or value == 0)


def _walk_applications(report: Report, queue: Queue, path: str, above: _Carried[int]) -> None:
    mine = _Carried(dict(above.users), dict(above.groups))
    for limit in queue.limits:
        value = limit.maxapplications
        for kind, names, got, passed in (
            ("user", limit.users, above.users, mine.users),
            ("group", limit.groups, above.groups, mine.groups),
        ):
            for name in filter(None, names):
                shown = value or "unlimited (0)"
                head = f"maxapplications of {kind} '{name}' ({shown}) is more than"
                passed[name] = value
                if name in got:
                    if _too_many(got[name], value):
                        report.add(
                            f"{head} the limit for '{name}' on a parent queue ({got[name]})",
                            queue=path,
                            limit=limit.limit or name,
                        )
                        passed[name] = got[name]
                elif name != WILDCARD and WILDCARD in got and _too_many(got[WILDCARD], value):
                    report.add(
                        f"{head} the {kind} wildcard's limit on a parent queue ({got[WILDCARD]})",
                        queue=path,
                        limit=limit.limit or name,
                    )
                    passed[name] = got[WILDCARD]
    for child in queue.queues:
        _walk_applications(report, child, f"{path}.{child.name}", mine)
