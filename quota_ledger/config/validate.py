"""YuniKorn's configuration validation (``configs.Validate``), reporting every problem.

For each partition, in YuniKorn's order: partition names, queue structure, limits structure,
ACLs / limits / child names of every queue (pre-order), queue guaranteed and max, placement
rule names, queue maxapplications, then limits down the hierarchy (resources, then
maxapplications). YuniKorn stops at the first error; here each check goes on where it makes
sense (a value that does not parse is reported once and then counts as not set), so an
operator sees every problem at once. Messages are YuniKorn's.
"""

from __future__ import annotations

import re

from quota_ledger.config.limits_check import (
    Report,
    Resources,
    add,
    check_limit_hierarchy,
    check_queue_limits,
    component_wise_min,
    fit_in_max_undef,
    go_string,
    is_zero,
    parse_map,
    queue_max,
    reports_queue_max_errors,
)
from quota_ledger.config.model import ROOT, Partition, Queue, SchedulerConfig, normalize
from quota_ledger.values import ConfigProblem

QUEUE_NAME = re.compile(r"[a-zA-Z0-9_:#/@-]{1,64}", re.ASCII)
RULE_NAME = re.compile(r"[_a-zA-Z][a-zA-Z0-9_]*", re.ASCII)
#: YuniKorn's ``common.ErrorInvalidQueueName``
INVALID_QUEUE_NAME = (
    "invalid queue name, max 64 characters consisting of alphanumeric characters and "
    "'-', '_', '#', '@', '/', ':' allowed"
)


def validate(cfg: SchedulerConfig) -> list[ConfigProblem]:
    """Every reason YuniKorn would refuse ``cfg``; an empty list means it is valid.

    ``cfg`` is normalized first (:func:`quota_ledger.config.model.normalize`), so partition
    names and queue paths in the problems are the normalized ones.
    """
    problems: list[ConfigProblem] = []
    seen: set[str] = set()
    for partition in normalize(cfg).partitions:
        report = Report(partition.name)
        if partition.name.lower() in seen:
            report.add(f"duplicate partition name found with name {partition.name}")
        seen.add(partition.name.lower())
        _check_partition(report, partition)
        problems.extend(report.problems)
    return problems


def _check_partition(report: Report, partition: Partition) -> None:
    if partition.queues is None:
        report.add("queue config is not set")
        return
    if not partition.queues:  # only before normalization: normalize inserts root
        return
    root = partition.queues[0]
    if root.resources is not None:
        report.add("root queue must not have resource limits set", queue=root.name)
    check_limits_structure(report, partition)
    _check_queues(report, root, root.name, level=1, is_root=True)
    _check_queue_resource(report, root, root.name, None, is_root=True)
    _check_placement_rules(report, partition)
    _check_queue_max_applications(report, root, root.name)
    check_limit_hierarchy(report, root, root.name)


def check_limits_structure(report: Report, partition: Partition) -> None:
    """The top queue is root; partition limits and root limits, when both set, are the same.

    After :func:`normalize` the top queue is always root; the check stays for configurations
    that were not normalized (and is tested on its own).
    """
    if not partition.queues:
        return
    top = partition.queues[0]
    if top.name.lower() != ROOT:
        report.add(f"top queue name is {top.name} not root", queue=top.name)
    if partition.limits and top.limits and partition.limits != top.limits:
        report.add("partition limits and root queue limits are not equivalent")


def _check_acl(report: Report, acl: str, path: str) -> None:
    acl = acl.strip()
    if acl and acl != "*" and len(acl.split()) > 2:
        report.add(f"multiple spaces found in ACL: '{acl}'", queue=path)


def _check_queues(report: Report, queue: Queue, path: str, *, level: int, is_root: bool) -> None:
    """YuniKorn's ``checkQueues``: ACLs, the queue's limits, its children's names; then each child."""
    _check_acl(report, queue.adminacl, path)
    _check_acl(report, queue.submitacl, path)
    check_queue_limits(report, queue, path, is_root=is_root)
    seen: set[str] = set()
    for child in queue.queues:
        child_path = f"{path}.{child.name}"
        if not QUEUE_NAME.fullmatch(child.name):
            report.add(INVALID_QUEUE_NAME, queue=child_path)
        if child.name.lower() in seen:
            message = f"duplicate child name found with name '{child.name}', level {level}"
            report.add(message, queue=child_path)
        seen.add(child.name.lower())
    for child in queue.queues:
        _check_queues(report, child, f"{path}.{child.name}", level=level + 1, is_root=False)


def _parsed(report: Report, queue: Queue, path: str, *, is_root: bool) -> tuple[Resources, Resources]:
    """The queue's guaranteed and max; a map that does not parse is reported once and counts as unset."""
    if queue.resources is None or is_root:  # root's resources were refused already
        return {}, {}
    guaranteed, errors = parse_map(queue.resources.guaranteed)
    for error in errors:
        report.add(error, queue=path)
    maximum, max_errors = parse_map(queue_max(queue))
    if not reports_queue_max_errors(queue, is_root=is_root):
        for error in max_errors:
            report.add(error, queue=path)
    return ({} if errors else guaranteed), ({} if max_errors else maximum)


def _check_queue_resource(
    report: Report, queue: Queue, path: str, parent_max: Resources | None, *, is_root: bool
) -> Resources:
    """YuniKorn's ``checkQueueResource``; returns what the queue counts for in its parent's sum.

    ``parent_max`` is the effective max above (the component-wise minimum of every ancestor's
    max). An all-zero max is a max of zero here, never "unlimited".
    """
    guaranteed, maximum = _parsed(report, queue, path, is_root=is_root)
    name = queue.name
    if not fit_in_max_undef(maximum, guaranteed):
        report.add(
            f"guaranteed resource {go_string(guaranteed)} is larger than maximum resource "
            f"{go_string(maximum)} for queue {name}",
            queue=path,
        )
    if not fit_in_max_undef(parent_max, maximum):
        report.add(
            f"max resource of parent {go_string(parent_max)} is smaller than maximum resource "
            f"{go_string(maximum)} for queue {name}",
            queue=path,
        )
    effective = component_wise_min(maximum, parent_max)
    children: Resources = {}
    for child in queue.queues:
        children = add(
            children, _check_queue_resource(report, child, f"{path}.{child.name}", effective, is_root=False)
        )
    if not fit_in_max_undef(guaranteed, children):
        report.add(
            f"guaranteed resource of parent {go_string(guaranteed)} is smaller than sum of guaranteed "
            f"resources {go_string(children)} of the children for queue {name}",
            queue=path,
        )
    if not fit_in_max_undef(effective, children):
        report.add(
            f"max resource {go_string(effective)} is smaller than sum of guaranteed resources "
            f"{go_string(children)} of the children for queue {name}",
            queue=path,
        )
    return children if is_zero(guaranteed) else guaranteed


def _check_placement_rules(report: Report, partition: Partition) -> None:
    """Only that each rule has a name that is an identifier; the rest is not the ledger's business."""
    for rule in partition.placementrules:
        name = rule.get("name")
        if not isinstance(name, str) or not RULE_NAME.fullmatch(name):
            shown = "" if name is None else str(name)
            report.add(f"invalid rule name {shown}, a name must be a valid identifier")


def _check_queue_max_applications(report: Report, queue: Queue, path: str) -> None:
    """Once a queue sets maxapplications, every child must set one, at most as large."""
    for child in queue.queues:
        child_path = f"{path}.{child.name}"
        if queue.maxapplications != 0:
            if queue.maxapplications < child.maxapplications:
                message = "parent maxApplications must be larger than child maxApplications"
                report.add(message, queue=child_path)
            elif child.maxapplications == 0:
                report.add(
                    "maxApplications is either undefined or zero, which is not allowed "
                    "when parent queue's maxApplications is defined",
                    queue=child_path,
                )
        _check_queue_max_applications(report, child, child_path)
