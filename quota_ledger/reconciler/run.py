"""The reconciler as a whole: the elected replica lists and watches namespaces, ResourceQuotas
and pods (pods once the other two are listed, so that their queues and quotas are in the ledger
first) and writes ResourceQuota status when asked; a replica that is not elected waits."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client

from quota_ledger.engine import QuotaEngine
from quota_ledger.reconciler.leader import LeaderElector, LeaseConfig
from quota_ledger.reconciler.listwatch import ListWatch
from quota_ledger.reconciler.metrics import Metrics
from quota_ledger.reconciler.objects import NamespaceSync, QuotaSync
from quota_ledger.reconciler.pods import PodSync
from quota_ledger.reconciler.settings import ReconcilerSettings

log = logging.getLogger("quota_ledger.reconciler")
#: seconds a term waits for its threads to end
JOIN_SECONDS = 30.0


class Reconciler:
    """Keeps one partition of the ledger in line with the cluster ``api`` (an ``ApiClient``)
    reaches."""

    def __init__(
        self,
        engine: QuotaEngine,
        api: Any,
        settings: ReconcilerSettings,
        *,
        lease: LeaseConfig | None = None,
        partition: str = "default",
        metrics: Metrics | None = None,
    ) -> None:
        self.engine = engine
        self.core = client.CoreV1Api(api)
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.pods = PodSync(engine, self.metrics, partition=partition, pending_grace=settings.pending_grace)
        self.namespaces = NamespaceSync(engine, self.metrics, partition=partition)
        self.quotas = QuotaSync(engine, self.metrics, partition=partition)
        self.elector = LeaderElector(client.CoordinationV1Api(api), lease) if lease is not None else None
        #: the list/watch loops of the current term (while leading)
        self.loops: list[ListWatch] = []

    def run(self, stop: threading.Event) -> None:
        """Reconcile until ``stop`` is set: while elected, or always without leader election."""
        if self.elector is None:
            self._term(stop)
            return
        elector = self.elector
        thread = threading.Thread(target=elector.run, args=(stop,), name="lease", daemon=True)
        thread.start()
        try:
            while not stop.is_set():
                if not elector.leading.wait(0.5):
                    continue
                term_stop = threading.Event()
                watcher = threading.Thread(
                    target=_until, args=(term_stop, stop, lambda: not elector.leading.is_set()), daemon=True
                )
                watcher.start()
                self._term(term_stop)
        finally:
            stop.set()
            thread.join(JOIN_SECONDS)

    def _term(self, stop: threading.Event) -> None:
        """Act until ``stop``: the list/watch loops and the status writer, each in a thread."""
        self.metrics.leader.set(1)
        s = self.settings
        loops = {
            kind: ListWatch(
                kind,
                call,
                handler,
                self.metrics,
                relist_every=s.relist_every,
                watch_timeout=s.watch_timeout,
            )
            for kind, call, handler in (
                ("namespaces", self.core.list_namespace, self.namespaces),
                ("resourcequotas", self.core.list_resource_quota_for_all_namespaces, self.quotas),
                ("pods", self.core.list_pod_for_all_namespaces, self.pods),
            )
        }
        self.loops = list(loops.values())
        firsts = [loops["namespaces"].synced, loops["resourcequotas"].synced]

        def pods() -> None:
            for synced in firsts:
                while not synced.wait(0.2):
                    if stop.is_set():
                        return
            loops["pods"].run(stop)

        targets: list[tuple[str, Callable[[], None]]] = [
            ("namespaces", lambda: loops["namespaces"].run(stop)),
            ("resourcequotas", lambda: loops["resourcequotas"].run(stop)),
            ("pods", pods),
        ]
        if s.write_status:
            targets.append(("status", lambda: self._write_status(stop)))
        threads = [threading.Thread(target=t, name=f"reconcile-{n}", daemon=True) for n, t in targets]
        for thread in threads:
            thread.start()
        stop.wait()
        for loop in self.loops:
            loop.interrupt()
        for thread in threads:
            thread.join(JOIN_SECONDS)
        self.metrics.leader.set(0)

    def _write_status(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.status_every):
            try:
                self.quotas.write_status(self.core)
            except Exception as error:  # the next round tries again
                log.warning("reconciler: writing ResourceQuota status failed: %s", error)


def _until(done: threading.Event, stop: threading.Event, lost: Callable[[], bool]) -> None:
    """Set ``done`` once ``stop`` is set or ``lost()`` (leadership gone)."""
    while not stop.wait(0.2):
        if lost():
            break
    done.set()
