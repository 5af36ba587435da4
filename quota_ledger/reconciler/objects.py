"""The ledger's side of namespaces and ResourceQuotas: mirrored as the cluster holds them.

A Namespace is placed on its queue with its YuniKorn annotations (``parentqueue``,
``namespace.quota``) by :meth:`QuotaEngine.apply_namespace`; a deleted namespace leaves its queue
as it is (its pods, deleted with it, release what they held). A ResourceQuota is applied as it
is (:meth:`QuotaEngine.apply_resource_quota`) and deleted with its object; a relist deletes the
ledger's quotas the cluster no longer has. An object is written again only when what the ledger
takes from it changed. An object the ledger refuses (an invalid quota, a bad annotation) is
logged and counted, and skipped.

With ``write_status`` the ledger's count is written back into each ResourceQuota's
``status.used`` (and ``status.hard``) where it differs from what the object shows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from quota_ledger.engine import QuotaEngine
from quota_ledger.model.errors import (
    DatabaseUnavailable,
    QuotaLedgerError,
    ResourceQuotaNotFound,
    SchemaNotReady,
)
from quota_ledger.reconciler.metrics import Metrics

log = logging.getLogger("quota_ledger.reconciler")
YUNIKORN = "yunikorn.apache.org/"


def _name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class NamespaceSync:
    """Places namespaces on their queues."""

    def __init__(self, engine: QuotaEngine, metrics: Metrics, *, partition: str) -> None:
        self.engine = engine
        self.metrics = metrics
        self.partition = partition
        #: namespace -> its YuniKorn annotations as last applied
        self.applied: dict[str, str] = {}

    def relisted(self, items: list[dict[str, Any]], listed_at: datetime) -> None:
        for obj in items:
            self.event("ADDED", obj)
        names = {_name(obj)[1] for obj in items}
        self.applied = {k: v for k, v in self.applied.items() if k in names}

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        _, name = _name(obj)
        if kind == "DELETED":
            self.applied.pop(name, None)
            return
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        mine = json.dumps({k: v for k, v in annotations.items() if k.startswith(YUNIKORN)}, sort_keys=True)
        if self.applied.get(name) == mine:
            return
        try:
            queue = self.engine.apply_namespace(obj, partition=self.partition)
        except (DatabaseUnavailable, SchemaNotReady):
            raise  # the loop relists once the database is back
        except QuotaLedgerError as error:  # a bad annotation, a queue managed elsewhere
            log.warning("reconciler: namespace %s not placed: %s", name, error)
            self.metrics.errors.labels("namespace").inc()
        else:
            log.debug("reconciler: namespace %s on %s", name, queue)
            self.metrics.objects.labels("namespace", "apply").inc()
        self.applied[name] = mine


class QuotaSync:
    """Mirrors ResourceQuota objects into the ledger."""

    def __init__(self, engine: QuotaEngine, metrics: Metrics, *, partition: str) -> None:
        self.engine = engine
        self.metrics = metrics
        self.partition = partition
        #: (namespace, name) -> the spec last applied
        self.applied: dict[tuple[str, str], str] = {}
        #: (namespace, name) -> the object's status as last seen
        self.status: dict[tuple[str, str], Mapping[str, Any]] = {}

    def relisted(self, items: list[dict[str, Any]], listed_at: datetime) -> None:
        for obj in items:
            self.event("ADDED", obj)
        live = {_name(obj) for obj in items}
        for namespace, name in self.engine.resource_quotas(partition=self.partition):
            if (namespace, name) not in live:
                self._delete(namespace, name)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        key = _name(obj)
        if kind == "DELETED":
            self._delete(*key)
            return
        self.status[key] = obj.get("status") or {}
        spec = json.dumps(obj.get("spec") or {}, sort_keys=True)
        if self.applied.get(key) == spec:
            return
        try:
            self.engine.apply_resource_quota(obj, partition=self.partition)
        except (DatabaseUnavailable, SchemaNotReady):
            raise
        except QuotaLedgerError as error:  # invalid as the API server would not have it
            log.warning("reconciler: resourcequota %s/%s not applied: %s", *key, error)
            self.metrics.errors.labels("resourcequota").inc()
        else:
            self.metrics.objects.labels("resourcequota", "apply").inc()
        self.applied[key] = spec

    def _delete(self, namespace: str, name: str) -> None:
        self.applied.pop((namespace, name), None)
        self.status.pop((namespace, name), None)
        try:
            self.engine.delete_resource_quota(namespace, name, partition=self.partition)
        except ResourceQuotaNotFound:
            return
        self.metrics.objects.labels("resourcequota", "delete").inc()

    def write_status(self, core: Any) -> int:
        """Write the ledger's ``hard`` and ``used`` into the status of every mirrored quota whose
        object shows something else (``core``: a ``CoreV1Api``); how many were written."""
        written = 0
        for (namespace, name), shown in list(self.status.items()):
            try:
                ledger = self.engine.resource_quota_status(namespace, name, partition=self.partition)
            except ResourceQuotaNotFound:
                continue
            if (
                dict(shown.get("used") or {}) == ledger["used"]
                and dict(shown.get("hard") or {}) == ledger["hard"]
            ):
                continue
            status = {"hard": ledger["hard"], "used": ledger["used"]}
            # an object: the client sends it as a strategic merge patch
            core.patch_namespaced_resource_quota_status(name, namespace, {"status": status})
            self.status[(namespace, name)] = status
            self.metrics.status_writes.inc()
            written += 1
        return written
