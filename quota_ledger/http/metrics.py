"""Prometheus metrics of the service (``prometheus-client``), on a registry of its own.

Labels are bounded: operation names, outcomes (error codes), partitions and resource names;
never user names or reservation ids.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from quota_ledger.engine import QuotaEngine
from quota_ledger.engine.granter import WAIT_BUCKETS
from quota_ledger.http import errors as http_errors
from quota_ledger.model.errors import OverQuota, QuotaLedgerError
from quota_ledger.runtime import overview, sweeper

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: what became of an admission review: a pod CREATE allowed or refused, a dry run (either, and
#: nothing held), another review (allowed, never judged), or no answer but an HTTP error
ADMISSION_OUTCOMES = ("allowed", "refused", "dry_run", "not_pod_create", "error")


class LimitsSync(Protocol):
    """What the metrics read of a sync of limits from elsewhere (the Keystone sync)."""

    failures: int

    def age_seconds(self) -> float | None: ...


class Metrics:
    def __init__(self, engine: QuotaEngine, sweep: sweeper.Health | None = None) -> None:
        self.registry = CollectorRegistry()
        self.operations = Counter(
            "quota_ledger_operations",
            "Ledger operations by outcome",
            ["operation", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "quota_ledger_operation_seconds",
            "Ledger operation latency by outcome",
            ["operation", "outcome"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.refusals = Counter(
            "quota_ledger_over_quota",
            "Over-quota refusals by partition and resource",
            ["partition", "resource"],
            registry=self.registry,
        )
        self.sweeper_batches = Counter(
            "quota_ledger_sweeper_rounds", "Expiry sweep rounds", registry=self.registry
        )
        self.sweeper_rows = Counter(
            "quota_ledger_sweeper_expired", "Reservations expired by the sweeper", registry=self.registry
        )
        self.drift_found = Counter(
            "quota_ledger_audit_drift_found", "Drifted counters found", registry=self.registry
        )
        self.drift_fixed = Counter(
            "quota_ledger_audit_drift_fixed", "Drifted counters fixed", registry=self.registry
        )
        self.admission_reviews = Counter(
            "quota_ledger_admission_reviews",
            "Admission webhook reviews by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.admission_latency = Histogram(
            "quota_ledger_admission_seconds",
            "Admission webhook latency by outcome, from the request's head to the answer",
            ["outcome"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        for outcome in ADMISSION_OUTCOMES:  # every series from the start: a rate over 0, not absent
            self.admission_reviews.labels(outcome)
            self.admission_latency.labels(outcome)
        self.registry.register(http_errors.INTERNAL_ERRORS)
        self.registry.register(_LedgerCollector(engine))
        if sweep is not None:
            self.registry.register(_SweeperCollector(sweep))
        self.up = Gauge("quota_ledger_up", "1 while the service runs", registry=self.registry)
        self.up.set(1)

    def watch_keystone(self, sync: LimitsSync) -> None:
        """Serve the Keystone sync's gauges: how old the limits in force are, failed syncs."""
        self.registry.register(_KeystoneCollector(sync))

    @contextmanager
    def observe(self, operation: str) -> Iterator[None]:
        """Count the operation run in the block, with its outcome and latency."""
        started = time.perf_counter()
        try:
            yield
        except Exception as error:
            self.record(operation, started, error)
            raise
        self.record(operation, started)

    def record(self, operation: str, started: float, error: Exception | None = None) -> None:
        """Count one operation begun at ``started`` (``time.perf_counter()``): its outcome
        (``error``: its refusal) and its latency until now."""
        outcome = "ok"
        if isinstance(error, OverQuota):
            outcome = "over_quota"
            for violation in error.violations:
                self.refusals.labels(violation.partition, violation.resource).inc()
        elif isinstance(error, QuotaLedgerError):
            outcome = str(http_errors.status_of(error)[0])
        elif error is not None:
            outcome = "error"
        self.operations.labels(operation, outcome).inc()
        self.latency.labels(operation, outcome).observe(time.perf_counter() - started)

    def review(self, outcome: str, started: float) -> None:
        """Count one admission review begun at ``started`` (``time.perf_counter()``), one of
        :data:`ADMISSION_OUTCOMES`, and its latency until now."""
        self.admission_reviews.labels(outcome).inc()
        self.admission_latency.labels(outcome).observe(time.perf_counter() - started)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LedgerCollector(Collector):
    """Read at scrape time: pending reservations, the oldest one's age, database retries."""

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine

    def collect(self):  # type: ignore[no-untyped-def]
        pending = GaugeMetricFamily(
            "quota_ledger_pending_reservations", "Pending reservations", labels=["partition"]
        )
        oldest = GaugeMetricFamily(
            "quota_ledger_oldest_pending_seconds",
            "Age of the oldest pending reservation",
            labels=["partition"],
        )
        retries = GaugeMetricFamily(
            "quota_ledger_db_retries", "Transactions retried, by cause", labels=["kind"]
        )
        try:
            for partition, count, age in overview.pending_summary(self.engine):
                pending.add_metric([partition], count)
                oldest.add_metric([partition], age)
        except QuotaLedgerError:
            pass  # the database is down: readyz says so; the scrape still answers
        for kind, count in sorted(self.engine.driver.retries.items()):
            retries.add_metric([kind], count)
        yield pending
        yield oldest
        yield retries
        yield from self._waiting()
        stats = self.engine.batch_stats
        yield CounterMetricFamily(
            "quota_ledger_group_commit_batches", "Transactions group commit decided", value=stats.batches
        )
        yield CounterMetricFamily(
            "quota_ledger_group_commit_requests", "Requests decided in group commit", value=stats.requests
        )

    def _waiting(self) -> Iterator[Metric]:
        waiting = GaugeMetricFamily(
            "quota_ledger_waiting_requests", "Requests waiting for capacity", labels=["partition", "queue"]
        )
        oldest = GaugeMetricFamily(
            "quota_ledger_oldest_waiting_seconds",
            "How long the longest-waiting request of the partition has waited",
            labels=["partition"],
        )
        longest: dict[str, float] = {}
        try:
            for partition, queue, count, age in overview.waiting_summary(self.engine):
                waiting.add_metric([partition, queue], count)
                longest[partition] = max(age, longest.get(partition, 0.0))
        except QuotaLedgerError:
            pass
        for partition, age in sorted(longest.items()):
            oldest.add_metric([partition], age)
        yield waiting
        yield oldest
        grants, buckets, count, total = self.engine.granter.stats.snapshot()
        granted = CounterMetricFamily(
            "quota_ledger_waiting_grants",
            "Waiting requests this process granted, by what freed the capacity",
            labels=["reason"],
        )
        for reason, n in sorted(grants.items()):
            granted.add_metric([reason], n)
        yield granted
        histogram = HistogramMetricFamily(
            "quota_ledger_wait_seconds", "How long the requests this process granted waited in line"
        )
        histogram.add_metric(
            [],
            [(str(bound), n) for bound, n in zip(WAIT_BUCKETS, buckets, strict=True)] + [("+Inf", count)],
            total,
        )
        yield histogram


class _SweeperCollector(Collector):
    """Read at scrape time: how the service's expiry loop fares."""

    def __init__(self, health: sweeper.Health) -> None:
        self.health = health

    def collect(self):  # type: ignore[no-untyped-def]
        yield CounterMetricFamily(
            "quota_ledger_sweeper_failed_rounds",
            "Expiry sweep rounds that failed",
            value=self.health.failed_rounds,
        )
        yield GaugeMetricFamily(
            "quota_ledger_sweeper_failing_seconds",
            "Seconds the expiry sweep has been failing (0: its last round succeeded)",
            value=self.health.failing_for(),
        )
        yield GaugeMetricFamily(
            "quota_ledger_sweeper_set_aside",
            "Reservations whose expiry failed on their own, which the sweeper skips (ids in the log)",
            value=len(self.health.set_aside),
        )


class _KeystoneCollector(Collector):
    """Read at scrape time: how old the limits synced from Keystone are."""

    def __init__(self, sync: LimitsSync) -> None:
        self.sync = sync

    def collect(self):  # type: ignore[no-untyped-def]
        age = self.sync.age_seconds()
        yield GaugeMetricFamily(
            "quota_ledger_openstack_limits_age_seconds",
            "Seconds since the limits in force were read from Keystone (NaN: not yet)",
            value=math.nan if age is None else age,
        )
        yield GaugeMetricFamily(
            "quota_ledger_openstack_sync_failures",
            "Keystone syncs that failed since the last one that succeeded",
            value=self.sync.failures,
        )
