"""Kubernetes objects: Namespaces placed on queues, ResourceQuotas and the admission configuration."""

from __future__ import annotations

from typing import Any

from quota_ledger.driver.tx import LedgerTx
from quota_ledger.engine.base import DEFAULT_PARTITION, EngineBase
from quota_ledger.kube import admission as kube_admission
from quota_ledger.kube import namespaces
from quota_ledger.kube import quotas as kube_quotas
from quota_ledger.ledger import configure, reads, resource_quotas
from quota_ledger.model import validation


class KubernetesObjects(EngineBase):
    """The Kubernetes calls of :class:`QuotaEngine` (the Pod calls are reservations)."""

    def apply_namespace(self, manifest: Any, *, partition: str = DEFAULT_PARTITION) -> str:
        """Place a Kubernetes Namespace (dict or YAML, as Kubernetes serves it) on its queue.

        ``root.<name>``, or under the queue named by ``yunikorn.apache.org/parentqueue``; the
        queue's max comes from ``yunikorn.apache.org/namespace.quota`` (or the deprecated
        ``namespace.max.cpu``/``.max.memory``) and is applied as a new configuration version.
        Returns the queue path.
        """
        validation.partition(partition)
        found = namespaces.placement(manifest)
        if found.max is not None:
            self.bounds.limit_set(found.max, namespaces.QUOTA)
        edit = configure.set_namespace_max(partition, found.queue, found.max)

        def work(tx: LedgerTx) -> str:
            self._apply(tx, edit)
            tx.place_namespace(partition, found.namespace, found.queue, tx.db_now())
            return found.queue

        return self.driver.run(work)

    def namespace_queue(self, namespace: str, *, partition: str = DEFAULT_PARTITION) -> str:
        """The queue a namespace's reservations go to (``root.<namespace>`` if never placed)."""
        validation.partition(partition)
        name = validation.namespace(namespace)
        return self.driver.run(lambda tx: reads.namespace_queue(tx, partition, name))

    def apply_resource_quota(self, manifest: Any, *, partition: str = DEFAULT_PARTITION) -> dict[str, Any]:
        """Create or replace a v1 ResourceQuota (dict or YAML, as Kubernetes serves it).

        Validated as the API server does (:class:`InvalidResourceQuota` names the field). Its
        usage is computed at once from the live reservations it matches in the namespace's
        queue. Returns its status (``hard`` and ``used`` in Kubernetes quantities).
        """
        validation.partition(partition)
        quota = kube_quotas.parse(manifest)
        self.bounds.limit_set(quota.hard, "spec.hard")
        edit = resource_quotas.put(partition, quota.key, kube_quotas.stored_manifest(quota))
        self.driver.run(lambda tx: self._apply(tx, kube_edit=edit))
        self._freed(partition, "limits")
        return self.resource_quota_status(quota.namespace, quota.name, partition=partition)

    def delete_resource_quota(self, namespace: str, name: str, *, partition: str = DEFAULT_PARTITION) -> None:
        """Delete a ResourceQuota; its counters go with it. Unknown quotas raise
        :class:`ResourceQuotaNotFound`."""
        validation.partition(partition)
        key = f"{validation.namespace(namespace)}/{validation.subdomain(name, 'name')}"
        edit = resource_quotas.remove(partition, key)
        self.driver.run(lambda tx: self._apply(tx, kube_edit=edit))
        self._freed(partition, "limits")

    def apply_admission_config(self, manifest: Any, *, partition: str = DEFAULT_PARTITION) -> None:
        """Set the ResourceQuota admission plugin's configuration (an AdmissionConfiguration
        or a ResourceQuotaConfiguration with ``limitedResources``); ``None`` removes it."""
        validation.partition(partition)
        parsed = None if manifest is None else kube_admission.parse(manifest)
        edit = resource_quotas.set_admission(partition, None if parsed is None else parsed.manifest)
        self.driver.run(lambda tx: self._apply(tx, kube_edit=edit))

    def resource_quotas(self, *, partition: str = DEFAULT_PARTITION) -> list[tuple[str, str]]:
        """(namespace, name) of every ResourceQuota in the partition."""
        validation.partition(partition)
        return self.driver.run(lambda tx: reads.quota_names(tx, self.rules, partition), read_only=True)

    def resource_quota_status(
        self, namespace: str, name: str, *, partition: str = DEFAULT_PARTITION
    ) -> dict[str, Any]:
        """``{"hard": {...}, "used": {...}}`` in Kubernetes quantities, from the ledger."""
        validation.partition(partition)
        key = f"{validation.namespace(namespace)}/{validation.subdomain(name, 'name')}"
        return self.driver.run(
            lambda tx: reads.quota_status(tx, self.rules, partition, key), isolation="REPEATABLE READ"
        )
