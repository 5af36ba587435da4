"""YuniKorn's configuration validation (``configs.Validate``), reporting every problem.

For each partition, in YuniKorn's order: partition names, queue structure, limits structure,
ACLs / limits / child names of every queue (pre-order), queue guaranteed and max, placement
rule names, queue maxapplications, then limits down the hierarchy (resources, then
maxapplications). YuniKorn stops at the first error; here each check goes on where it makes
sense (a value that does not parse is reported once and then counts as not set), so an
operator sees every problem at once, each once. The checks are YuniKorn's; the messages are
the ledger's own. Partition names are checked as :meth:`QuotaEngine.reserve` checks its
``partition`` argument, so a configuration cannot create a partition no call can name.
"""

from __future__ import annotations

import re

from quota_ledger.config.model import (
    QUEUEING_POLICIES,
    QUEUEING_POLICY,
    ROOT,
    Partition,
    Queue,
    SchedulerConfig,
    normalize,
)
from quota_ledger.config.placement import check_placement_rules
from quota_ledger.config.user_group_checks import (
    Report,
    Resources,
    add,
    check_limit_hierarchy,
    check_queue_limits,
    component_wise_min,
    fit_in_max_undef,
    human,
    is_zero,
    parse_map,
    queue_max,
    reports_queue_max_errors,
)
from quota_ledger.model import queues
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.model.values import ConfigProblem

QUEUE_NAME = re.compile(r"[a-zA-Z0-9_:#/@-]{1,64}", re.ASCII)
#: YuniKorn's queue name rule, in words
INVALID_QUEUE_NAME = (
    "queue name is not valid: use 1 to 64 characters, each a letter, a digit or one of - _ # @ / :"
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
        try:
            queues.validate_partition(partition.name)
        except InvalidRequest as error:
            report.add(str(error))
        if partition.name.lower() in seen:
            report.add(f"partition {partition.name} is configured more than once (names ignore case)")
        seen.add(partition.name.lower())
        _check_partition(report, partition)
        problems.extend(report.problems)
    return list(dict.fromkeys(problems))  # each problem once, in the order found


def _check_partition(report: Report, partition: Partition) -> None:
    if partition.queues is None:
        report.add("the partition has no queues: add a queues list (it may be empty)")
        return
    if not partition.queues:  # only before normalization: normalize inserts root
        return
    root = partition.queues[0]
    if root.resources is not None:
        report.add(
            "the root queue cannot set resources (guaranteed or max): root is the whole partition",
            queue=root.name,
        )
    check_limits_structure(report, partition)
    _check_queues(report, root, root.name, level=1, is_root=True)
    _check_queue_resource(report, root, root.name, None, is_root=True)
    check_placement_rules(report, partition)
    check_node_sort_policy(report, partition)
    check_unknown_names(report, partition)
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
        report.add(f"the top queue must be root, not {top.name}", queue=top.name)
    if partition.limits and top.limits and partition.limits != top.limits:
        report.add("the partition's limits and the root queue's limits differ: set them in one place")


def _check_acl(report: Report, acl: str, path: str) -> None:
    acl = acl.strip()
    if acl and acl != "*" and len(acl.split()) > 2:
        report.add(
            f"ACL '{acl}' has more than two parts: write 'users groups' (comma-separated lists)", queue=path
        )


def _check_queues(report: Report, queue: Queue, path: str, *, level: int, is_root: bool) -> None:
    """YuniKorn's ``checkQueues``: ACLs, the queue's limits, its children's names; then each child."""
    _check_acl(report, queue.adminacl, path)
    _check_acl(report, queue.submitacl, path)
    policy = queue.properties.get(QUEUEING_POLICY)
    if policy is not None and policy not in QUEUEING_POLICIES:
        report.add(f"{QUEUEING_POLICY} {policy!r} is not known: use StrictFIFO or BestEffortFIFO", queue=path)
    check_queue_limits(report, queue, path, is_root=is_root)
    seen: set[str] = set()
    for child in queue.queues:
        child_path = f"{path}.{child.name}"
        if not QUEUE_NAME.fullmatch(child.name):
            report.add(INVALID_QUEUE_NAME, queue=child_path)
        if child.name.lower() in seen:
            message = f"queue {child.name} appears more than once under {path} (names ignore case)"
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
    if not fit_in_max_undef(maximum, guaranteed):
        report.add(f"guaranteed ({human(guaranteed)}) is more than max ({human(maximum)})", queue=path)
    if not fit_in_max_undef(parent_max, maximum):
        report.add(f"max ({human(maximum)}) is more than the max above it ({human(parent_max)})", queue=path)
    effective = component_wise_min(maximum, parent_max)
    children: Resources = {}
    for child in queue.queues:
        children = add(
            children, _check_queue_resource(report, child, f"{path}.{child.name}", effective, is_root=False)
        )
    if not fit_in_max_undef(guaranteed, children):
        report.add(
            f"guaranteed ({human(guaranteed)}) is less than what the child queues are guaranteed "
            f"together ({human(children)})",
            queue=path,
        )
    if not fit_in_max_undef(effective, children):
        report.add(
            f"max ({human(effective)}) is less than what the child queues are guaranteed together "
            f"({human(children)})",
            queue=path,
        )
    return children if is_zero(guaranteed) else guaranteed


#: what a partition does with a name its configuration does not know ("": warn)
UNKNOWN_NAMES = ("", "warn", "refuse")
#: YuniKorn's node sorting policies ("" is its default, ``fair``)
NODE_SORT_POLICIES = ("", "fair", "binpacking")


def check_node_sort_policy(report: Report, partition: Partition) -> None:
    """YuniKorn's ``checkNodeSortingPolicy``: a known policy, no negative weight (kept, not used)."""
    policy = partition.nodesortpolicy
    if policy is None:
        return
    if policy.type not in NODE_SORT_POLICIES:
        report.add(f"node sorting policy {policy.type!r} is not known: use fair or binpacking")
    for resource, weight in sorted(policy.resourceweights.items()):
        if weight < 0:
            report.add(f"node sorting weight of {resource} is {weight}: weights cannot be negative")


def check_unknown_names(report: Report, partition: Partition) -> None:
    """The ledger's own ``unknownnames``: empty (``warn``), ``warn`` or ``refuse``."""
    if partition.unknownnames not in UNKNOWN_NAMES:
        report.add(f"unknownnames {partition.unknownnames!r} is not known: use warn or refuse")


def _check_queue_max_applications(report: Report, queue: Queue, path: str) -> None:
    """Once a queue sets maxapplications, every child must set one, at most as large."""
    for child in queue.queues:
        child_path = f"{path}.{child.name}"
        if queue.maxapplications != 0:
            if queue.maxapplications < child.maxapplications:
                message = (
                    f"maxapplications {child.maxapplications} is more than the parent queue's "
                    f"maxapplications {queue.maxapplications}"
                )
                report.add(message, queue=child_path)
            elif child.maxapplications == 0:
                report.add(
                    "maxapplications must be set (1 or more): the parent queue sets maxapplications "
                    f"{queue.maxapplications}",
                    queue=child_path,
                )
        _check_queue_max_applications(report, child, child_path)
