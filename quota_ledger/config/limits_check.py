"""YuniKorn's user and group limit checks, and the resource arithmetic validation shares.

Two kinds of check (``pkg/common/configs/configvalidator.go``):

- within one queue (``checkLimit``): names, ordering of wildcards, the values of each limit
  against the queue's own ``maxapplications`` and ``max``;
- down the hierarchy (``checkLimitResource``, ``checkLimitMaxApplications``): a user's or
  group's limit must fit what the same name, or failing that the wildcard, got further up.

Messages are YuniKorn's, typos included, so that an operator can search for them. Unlike
YuniKorn, every problem is reported, not only the first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from quota_ledger.config.model import Limit, Queue
from quota_ledger.config.quantity import parse_config_resources
from quota_ledger.errors import InvalidRequest
from quota_ledger.values import ConfigProblem

WILDCARD = "*"
USER_NAME = re.compile(r"[_a-zA-Z][a-zA-Z0-9:#/_.@-]*[$]?", re.ASCII)
GROUP_NAME = re.compile(r"[_a-zA-Z][a-zA-Z0-9:_.-]*", re.ASCII)
ONLY_WILDCARD_GROUP = (
    "should not specify only one group limit that is using the wildcard. "
    "There must be at least one limit with a group name defined "
)

Resources = dict[str, int]


# -- resources, with YuniKorn's comparison rules (pkg/common/resources/resources.go) ------------


def go_string(resource: Mapping[str, int] | None) -> str:
    """Go's rendering of a resource, keys sorted: ``map[memory:10000 vcore:100000]``."""
    if resource is None:
        return "nil resource"
    return "map[" + " ".join(f"{k}:{v}" for k, v in sorted(resource.items())) + "]"


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
            errors.append(str(exc))
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


def _go_struct(limit: Limit) -> str:
    """Go's ``%v`` of a ``configs.Limit``: ``{desc [sue bob] [dev] map[memory:10] 2}``."""
    resources = " ".join(f"{k}:{v}" for k, v in sorted(limit.maxresources.items()))
    return (
        f"{{{limit.limit} [{' '.join(limit.users)}] [{' '.join(limit.groups)}] "
        f"map[{resources}] {limit.maxapplications}}}"
    )


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
            report.add(f"parse queue {queue.name} max resource failed: {error}", queue=path)
        if errors:
            maximum = None  # treated as not set, as for every later check
    users: set[str] = set()
    groups: set[str] = set()
    only_wildcard_reported = False
    for limit in queue.limits:
        if not limit.users and not limit.groups:
            report.add(
                f"empty user and group lists defined in limit '{_go_struct(limit)}'",
                queue=path,
                limit=limit_label(limit),
            )
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
    for name in names:
        label = limit.limit or name
        if name != WILDCARD and not pattern.fullmatch(name):
            report.add(f"invalid limit {kind} name '{name}' in limit definition", queue=path, limit=label)
            continue
        if name in seen:
            report.add(f"duplicated {kind} name '{name}', already exists", queue=path, limit=label)
            continue
        seen.add(name)
        # The wildcard must be the last name of its kind across all limits of the queue.
        if WILDCARD in seen and name != WILDCARD:
            report.add(
                f"should not set no wildcard {kind} {name} after wildcard {kind} limit",
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
            message = f"MaxResources should be greater than zero in '{limit.limit}' limit"
            report.add(message, queue=path, limit=label)
    elif limit.maxapplications == 0:
        report.add(
            f"invalid resource combination for limit {limit.limit} all resource limits are null",
            queue=path,
            limit=label,
        )
    if queue.maxapplications != 0 and queue.maxapplications < limit.maxapplications:
        report.add(
            f"invalid MaxApplications settings for limit {limit.limit} "
            "exceed current the queue MaxApplications",
            queue=path,
            limit=label,
        )
    if maximum is not None and resources is not None and not fit_in_max_undef(maximum, resources):
        report.add(
            f"invalid MaxResources settings for limit {limit.limit} exeecd current the queue MaxResources",
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
                head = f"{kind} {name} max resource {go_string(value)} of queue {queue.name} is greater than"
                if name in got:
                    if not fit_in_max_undef(got[name], value):
                        report.add(
                            f"{head} immediate or ancestor parent maximum resource {go_string(got[name])}",
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
                            f"{head} wildcard maximum resource {go_string(wildcard)} "
                            "of immediate or ancestor parent queue",
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
                head = f"{kind} {name} max applications {value} of queue {queue.name} is greater than"
                passed[name] = value
                if name in got:
                    if _too_many(got[name], value):
                        report.add(
                            f"{head} immediate or ancestor parent max applications {got[name]}",
                            queue=path,
                            limit=limit.limit or name,
                        )
                        passed[name] = got[name]
                elif name != WILDCARD and WILDCARD in got and _too_many(got[WILDCARD], value):
                    report.add(
                        f"{head} wildcard max applications {got[WILDCARD]} "
                        "of immediate or ancestor parent queue",
                        queue=path,
                        limit=limit.limit or name,
                    )
                    passed[name] = got[WILDCARD]
    for child in queue.queues:
        _walk_applications(report, child, f"{path}.{child.name}", mine)
