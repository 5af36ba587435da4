"""Applying a configuration: validate, then bring every limit counter in line, in one transaction.

A configuration covers all partitions. The writer locks the config head (writers queue there),
then every partition exclusively, so a reservation sees either the old limits or the new ones,
never a mix. Under those locks every limit counter is recomputed from the queue counters and
the application rows, so applying a configuration also repairs drift in what it touches.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import yaml

from quota_ledger.config import diff as config_diff
from quota_ledger.config import identity, model, queue_max
from quota_ledger.config.rules import PartitionRules, Rules, compile_config
from quota_ledger.config.validate import validate
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.ledger import reads, resource_quotas
from quota_ledger.ledger.compiled import compile_stored
from quota_ledger.model import queues, validation
from quota_ledger.model.counters import QUEUE, QUOTA, SUBTREE
from quota_ledger.model.errors import ConfigError, InvalidRequest, RemovesAllLimits
from quota_ledger.model.quantity import APPLICATIONS
from quota_ledger.model.values import ConfigProblem

# libyaml's safe loader where it is installed: the pure-Python scanner is quadratic on some inputs.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

Document = dict[str, Any]
Capacity = dict[str, dict[str, int]]
Edit = Callable[[Document, Capacity], tuple[Any, Capacity]]
KubeEdit = Callable[[dict[str, Any]], None]


def check(
    source: Any, bounds: validation.Bounds | None = None
) -> tuple[model.SchedulerConfig, list[ConfigProblem]]:
    """Parse and validate; returns the normalized config and every problem found.

    Unknown keys are reported and the rest of the document is still validated, so one typo
    does not hide the other problems. Too deep a document is refused before it is built.
    """
    source = unwrap(source)
    if (problem := _shape_problem(source)) is not None:
        return model.SchedulerConfig(), [ConfigProblem(partition="", queue="", limit="", message=problem)]
    config, loaded = model.load_checked(source)
    if config is None:
        return model.SchedulerConfig(), loaded
    normalized = model.normalize(config)
    problems = list(dict.fromkeys([*loaded, *validate(config)]))
    dumped = model.dump(normalized)
    if (problem := validation.document_problem(dumped)) is not None:
        problems.append(ConfigProblem(partition="", queue="", limit="", message=problem))
    problems += _bound_problems(dumped, bounds or validation.Bounds())
    return normalized, problems


def _shape_problem(source: Any) -> str | None:
    """Why the document cannot even be built (too deep, NUL bytes, ...), or None."""
    if isinstance(source, str | bytes):
        return validation.yaml_problem(source)
    return validation.document_problem(source)


def _bound_problems(document: Mapping[str, Any], bounds: validation.Bounds) -> list[ConfigProblem]:
    """Limit sets naming too many resources, and partitions naming too many in all."""
    found = []
    for partition in document.get("partitions") or []:
        name = _partition_name(partition.get("name") or "")
        names: set[str] = set()
        pending = [("", partition)]  # (queue path, node); the partition holds its own limits
        while pending:
            path, node = pending.pop()
            sets = [("resources.max", (node.get("resources") or {}).get("max"))]
            sets.append(("resources.guaranteed", (node.get("resources") or {}).get("guaranteed")))
            limits = node.get("limits") or []
            sets += [(f"limit {lim.get('limit', '')!r}", lim.get("maxresources")) for lim in limits]
            for where, resources in sets:
                if not resources:
                    continue
                names.update(resources)
                try:
                    bounds.limit_set(resources)
                except InvalidRequest as error:
                    found.append(ConfigProblem(partition=name, queue=path, limit=where, message=str(error)))
            for child in node.get("queues") or []:
                pending.append((f"{path}.{child.get('name')}" if path else str(child.get("name")), child))
        try:
            bounds.partition(names, name)
        except InvalidRequest as error:
            found.append(ConfigProblem(partition=name, queue="", limit="", message=str(error)))
    return found


def unwrap(source: Any) -> Any:
    """The configuration inside ``{"version": n, "config": {...}}``, the shape ``GET /v1/config``
    and ``config show --json`` return, so that it can be sent back unchanged (the version is
    informational); any other source as it is."""
    data = source
    if isinstance(source, str | bytes):
        if validation.yaml_problem(source) is not None:
            return source  # the checked load reports it, before anything recurses into it
        try:
            data = yaml.load(source, Loader=_LOADER)  # noqa: S506 (a safe loader)
        except yaml.YAMLError:
            return source  # model.load reports it, with its position
    if (
        isinstance(data, Mapping)
        and set(data) == {"version", "config"}
        and isinstance(data["config"], Mapping)
    ):
        return dict(data["config"])
    return source


def apply(
    tx: LedgerTx,
    edit: Edit | None = None,
    *,
    kube_edit: KubeEdit | None = None,
    compiled: Callable[[Rules], None] | None = None,
    bounds: validation.Bounds | None = None,
    allow_removing_all: bool = True,
) -> int:
    """Apply ``edit(current document, current capacity)`` and ``kube_edit(Kubernetes objects)``
    as the next version; returns it. ``compiled`` gets the new version's rules once committed.

    When nothing would change, no version is made and the version in force is returned.
    Without ``allow_removing_all``, a change that leaves a partition with limits now without
    any raises :class:`RemovesAllLimits`.
    """
    version = tx.lock_config_head()
    stored = tx.load_config(version)
    config, new_capacity, kube = _proposed(tx, stored, edit, kube_edit, bounds)
    if _same(stored, (model.dump(config), new_capacity, kube)):
        return version
    rules = compile_config(config, new_capacity, version + 1, kube)
    if not allow_removing_all:
        emptied = config_diff.emptied_partitions(compile_stored(version, *stored), rules)
        if emptied:
            raise RemovesAllLimits(emptied)
    names = sorted(set(tx.partition_names()) | set(rules.partitions))
    now = tx.db_now()
    for name in names:
        tx.create_missing(name, [], now)  # a row to lock on MariaDB and SQLite; the sweeper's list
        tx.lock_partition(name, exclusive=True)
    for name in names:
        partition_rules = rules.partition(name)
        old = tx.identity_counters(name, lock=False, kinds=[QUOTA])
        live = tx.live_reservations(name, resource_quotas.queues_to_lock(partition_rules, old), lock=True)
        reconcile(tx, partition_rules, now)
        resource_quotas.reconcile(tx, partition_rules, live, now)
    tx.store_config(version + 1, model.dump(config), new_capacity, kube, now)
    if compiled is not None:
        tx.after_commit.append(lambda: compiled(rules))
    return version + 1


def diff(tx: LedgerTx, source: Any, bounds: validation.Bounds | None = None) -> config_diff.ConfigDiff:
    """What applying ``source`` would do now (see :class:`~quota_ledger.config.diff.ConfigDiff`);
    changes nothing. Raises :class:`ConfigError` as applying it would."""
    version = tx.config_version()
    stored = tx.load_config(version)
    config, capacity, kube = _proposed(tx, stored, replace_with(source), None, bounds)
    old = compile_stored(version, *stored)
    new = compile_config(config, capacity, version + 1, kube)
    added: list[config_diff.LimitChange] = []
    removed: list[config_diff.LimitChange] = []
    changed: list[config_diff.LimitChange] = []
    over: list[config_diff.OverLimit] = []
    for name in sorted(set(old.partitions) | set(new.partitions)):
        for change in config_diff.changes(name, old.partition(name), new.partition(name)):
            (added if change.old is None else removed if change.new is None else changed).append(change)
        over += config_diff.over_limits(
            name, old.partition(name), new.partition(name), tx.all_counters(name), tx.read_apps(name)
        )
    return config_diff.ConfigDiff(
        version=version,
        identical=_same(stored, (model.dump(config), capacity, kube)),
        added=tuple(added),
        removed=tuple(removed),
        changed=tuple(changed),
        over_limit=tuple(over),
        removes_all_limits=tuple(config_diff.emptied_partitions(old, new)),
    )


def _proposed(
    tx: LedgerTx,
    stored: tuple[Document, Capacity, dict[str, Any]],
    edit: Edit | None,
    kube_edit: KubeEdit | None,
    bounds: validation.Bounds | None,
) -> tuple[model.SchedulerConfig, Capacity, dict[str, Any]]:
    """The validated configuration, capacity and Kubernetes objects after the edits."""
    document, capacity, kube = copy.deepcopy(stored)
    source, new_capacity = (edit or _unchanged)(document, capacity)
    config, problems = check(source, bounds)
    if problems:
        raise ConfigError(problems)
    if kube_edit is not None:
        kube_edit(kube)
    for partition, objects in kube.items():
        for key, entry in objects.get("quotas", {}).items():
            namespace = key.split("/", 1)[0]
            entry["queue"] = reads.namespace_queue(tx, partition, namespace)
    return config, new_capacity, kube


def _same(stored: tuple[Any, ...], proposed: tuple[Any, ...]) -> bool:
    """Whether the proposed version would be stored exactly as the one in force is."""
    return all(
        json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        for a, b in zip(stored, proposed, strict=True)
    )


def _unchanged(document: Document, capacity: Capacity) -> tuple[Any, Capacity]:
    return document, capacity


def reconcile(tx: LedgerTx, rules: PartitionRules, now: datetime) -> None:
    """Make the partition's limit counters exactly what ``rules`` enforce, with exact values.

    Caller holds the exclusive partition lock. Locks application rows, then queue, subtree
    and user/group counters: the canonical order.
    """
    partition = rules.name
    apps = tx.lock_all_apps(partition)
    own = tx.lock_all_counters(partition, QUEUE)
    existing = {(c.scope, c.resource): c for c in tx.lock_all_counters(partition, SUBTREE)}
    wanted = rules.queue_limits()
    counts = identity.queue_app_counts(apps)
    for key, counter in existing.items():
        if key not in wanted:
            tx.delete_counter(counter.id)
        elif counter.limit != wanted[key]:
            tx.set_limit(counter.id, wanted[key], now)
    for (queue, resource), limit in sorted(wanted.items()):
        if (queue, resource) in existing:
            continue
        if resource == APPLICATIONS:
            in_use, reserved = identity.subtree_count(counts, queue), 0
        else:
            below = [c for c in own if c.resource == resource and queues.in_subtree(c.scope, queue)]
            in_use, reserved = sum(c.in_use for c in below), sum(c.reserved for c in below)
        tx.insert_subtree_counter(
            partition, queue, resource, in_use=in_use, reserved=reserved, limit=limit, now=now
        )
    named = tx.identity_counters(partition, lock=True)
    current = {(c.scope_type, c.name or "", c.scope, c.resource): c for c in named}
    desired = identity.desired(rules, apps)
    tx.delete_identity_counters([c.id for key, c in current.items() if key not in desired])
    updates = {}
    for wanted_key, limit in desired.items():
        if (found := current.get(wanted_key)) is not None:
            in_use, reserved = identity.value(apps, wanted_key)
            if (found.in_use, found.reserved, found.limit) != (in_use, reserved, limit):
                updates[found.id] = (in_use, reserved, limit)
    tx.set_identity_counters(updates, now)
    tx.insert_identity_counters(
        partition,
        {key: (*identity.value(apps, key), limit) for key, limit in desired.items() if key not in current},
        now,
    )


def check_in_force(tx: LedgerTx, source: Any, bounds: validation.Bounds | None = None) -> list[ConfigProblem]:
    """Every problem :func:`replace_with` and :func:`check` would find in ``source`` against the
    configuration in force: an empty document is one when it would remove limits."""
    problems = check(source, bounds)[1]
    if not problems and _shape_problem(source) is None and model.is_empty(source):
        document, capacity, _kube = tx.load_config(tx.config_version())
        if _has_limits(document, capacity):
            problems.append(EMPTY_DOCUMENT)
    return problems


def replace_with(source: Any) -> Edit:
    """An edit that applies ``source`` as the whole configuration (root capacity is kept)."""

    def edit(document: Document, capacity: Capacity) -> tuple[Any, Capacity]:
        empty = _shape_problem(source) is None and model.is_empty(source)
        if empty and _has_limits(document, capacity):
            raise ConfigError([EMPTY_DOCUMENT])
        return source, capacity

    return edit


def _has_limits(document: Document, capacity: Capacity) -> bool:
    """Whether the stored configuration limits anything (a queue, a user, a group, root)."""
    rules = compile_config(model.normalize(model.load(dict(document))), capacity, 0)
    return any(p.queue_limits() or p.has_identity_limits for p in rules.partitions.values())


#: why ``apply`` refuses an empty document over a configuration in force (validation accepts it)
EMPTY_DOCUMENT = ConfigProblem(
    partition="",
    queue="",
    limit="",
    message=(
        "the document is empty: YuniKorn reads that as its default configuration, with no "
        "partitions, which would remove every limit in force; apply a configuration that lists "
        "what to keep, or 'partitions: []' with the confirmation to remove everything on purpose "
        "(--allow-removing-all, ?confirm=remove-all, allow_removing_all=True)"
    ),
)


def set_queue_max(partition: str, queue: str, limits: Mapping[str, int | None]) -> Edit:
    """An edit that sets (or with None removes) ``queue``'s max resources in the stored config,
    adding the queue when missing (see :func:`quota_ledger.config.queue_max.set_queue_max`)."""

    def edit(document: Document, capacity: Capacity) -> tuple[Any, Capacity]:
        queue_max.set_queue_max(document, capacity, partition, queue, limits)
        return document, capacity

    return edit


def _partition_name(name: str) -> str:
    return "default" if name == "" or name.lower() == "default" else name


def set_namespace_max(partition: str, queue: str, limits: Mapping[str, int] | None) -> Edit:
    """An edit that makes ``queue``'s max exactly ``limits``: a namespace's quota annotation.

    The queue is created in the configuration only when there is a quota to hold; without one
    an existing max is removed and the queue stays dynamic.
    """

    def edit(document: Document, capacity: Capacity) -> tuple[Any, Capacity]:
        if limits is None and not _has_queue(document, partition, queue):
            return document, capacity
        node = queue_max.queue_node(document, partition, queue)
        current = node.get("resources", {}).get("max", {})
        wanted: dict[str, int | None] = {res: None for res in current}
        wanted.update(limits or {})
        return set_queue_max(partition, queue, wanted)(document, capacity)

    return edit


def _has_queue(document: Document, partition: str, queue: str) -> bool:
    parts = document.get("partitions", [])
    found = next((p for p in parts if _partition_name(p.get("name", "")) == partition), None)
    level: list[dict[str, Any]] = found.get("queues", []) if found else []
    for segment in queue.split("."):
        node = next((q for q in level if q.get("name") == segment), None)
        if node is None:
            return False
        level = node.get("queues", [])
    return True
