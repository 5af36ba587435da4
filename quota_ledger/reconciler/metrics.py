"""The reconciler's metrics (``prometheus-client``, a registry of its own), served in the text
format on ``--metrics-port`` when one is set. Labels are bounded: kinds and reasons, never pod
or namespace names (those go to the log)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """Counters of what the reconciler did."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.committed = Counter(
            "quota_ledger_reconciler_pods_committed", "Pending reservations committed", registry=r
        )
        self.charged = Counter(
            "quota_ledger_reconciler_pods_charged",
            "Pods the ledger did not know, charged when seen",
            registry=r,
        )
        self.released = Counter(
            "quota_ledger_reconciler_pods_released", "Reservations of pods gone or ended released", registry=r
        )
        self.abandoned = Counter(
            "quota_ledger_reconciler_pending_rolled_back",
            "Pending reservations of pods a relist did not find, made longer than the grace before it",
            registry=r,
        )
        self.overruns = Counter(
            "quota_ledger_reconciler_overruns",
            "Pods charged beyond a limit (one per limit exceeded), by kind of limit",
            ["limit"],
            registry=r,
        )
        self.relists = Counter(
            "quota_ledger_reconciler_relists",
            "Full lists, by kind and reason",
            ["kind", "reason"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "quota_ledger_reconciler_watch_restarts",
            "Watches resumed from their last resourceVersion, by kind and reason",
            ["kind", "reason"],
            registry=r,
        )
        self.errors = Counter(
            "quota_ledger_reconciler_errors",
            "Events the ledger could not take (each followed by a relist), by kind",
            ["kind"],
            registry=r,
        )
        self.objects = Counter(
            "quota_ledger_reconciler_objects_mirrored",
            "Namespaces and ResourceQuotas written to the ledger, by kind and action",
            ["kind", "action"],
            registry=r,
        )
        self.status_writes = Counter(
            "quota_ledger_reconciler_status_writes", "ResourceQuota status.used written back", registry=r
        )
        self.leader = Gauge(
            "quota_ledger_reconciler_leader", "1 while this replica holds the Lease and acts", registry=r
        )

    def text(self) -> bytes:
        """The metrics in the Prometheus text format."""
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:  # noqa: S104 - a pod's own port
        """Serve ``/metrics`` on ``host:port`` from a daemon thread."""
        start_http_server(port, addr=host, registry=self.registry)
