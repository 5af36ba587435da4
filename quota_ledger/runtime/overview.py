"""What the dashboard and the metrics show: read-only views over the ledger.

With replicas (``read_urls``) these read from one, so they may lag the writer by the
replication delay; looking a reservation up by a short id stays on the writer."""

from __future__ import annotations

from datetime import UTC, datetime

from quota_ledger.driver import history as history_rows
from quota_ledger.driver import reads
from quota_ledger.driver.tx import LedgerTx
from quota_ledger.engine import QuotaEngine
from quota_ledger.model import drift, history, queues
from quota_ledger.model.counters import QUEUE, SUBTREE, Counter
from quota_ledger.model.values import Reservation, Usage


def pending_summary(engine: QuotaEngine) -> list[tuple[str, int, float]]:
    """(partition, pending reservations, age in seconds of the oldest)."""
    return engine.driver.run(lambda tx: reads.pending_summary(tx.conn), read_only=True)


def waiting_summary(engine: QuotaEngine) -> list[tuple[str, str, int, float]]:
    """(partition, queue, waiting requests, seconds the longest of them has waited)."""

    names = engine.driver.partitions()

    def read(tx: LedgerTx) -> list[tuple[str, str, int, float]]:
        now = tx.db_now().replace(tzinfo=UTC)
        return [
            (partition, queue, n, max(0.0, (now - oldest).total_seconds()))
            for partition in names
            for queue, n, oldest in tx.queue_lines(partition)
        ]

    return engine.driver.run(read, read_only=True)


def soonest_expiring(engine: QuotaEngine, partition: str = "default", limit: int = 20) -> list[Reservation]:
    queues.validate_partition(partition)
    found = engine.driver.run(lambda tx: reads.soonest_expiring(tx.conn, partition, limit), read_only=True)
    return [s.reservation for s in found]


def queue_tree(engine: QuotaEngine, partition: str = "default") -> dict[str, dict[str, Usage]]:
    """Every queue with usage or a limit (and its ancestors): subtree usage and own limit."""
    queues.validate_partition(partition)
    counters = engine.driver.run(
        lambda tx: tx.all_counters(partition), isolation="REPEATABLE READ", read_only=True
    )
    own_in_use = {(c.scope, c.resource): c.in_use for c in counters if c.scope_type == QUEUE}
    own_reserved = {(c.scope, c.resource): c.reserved for c in counters if c.scope_type == QUEUE}
    in_use, reserved = drift.subtree_totals(own_in_use), drift.subtree_totals(own_reserved)
    limited = {(c.scope, c.resource): c for c in counters if c.scope_type == SUBTREE}
    tree: dict[str, dict[str, Usage]] = {}
    for key in sorted(set(in_use) | set(limited)):
        queue, resource = key
        if (counter := limited.get(key)) is not None:  # the limit's own counter holds the subtree sum
            usage = Usage(in_use=counter.in_use, reserved=counter.reserved, limit=counter.limit)
        else:
            usage = Usage(in_use=in_use.get(key, 0), reserved=reserved.get(key, 0), limit=None)
        tree.setdefault(queue, {})[resource] = usage
    return tree


def usage_history(
    engine: QuotaEngine, queue: str, *, partition: str = "default", window: str = "1h"
) -> history.UsageHistory:
    """In-use and reserved usage of ``queue``'s subtree over ``window`` (see ``history.WINDOWS``)."""
    queues.validate_partition(partition)
    queues.validate_queue(queue)
    span = history.window_named(window)

    def read(tx: LedgerTx) -> tuple[datetime, list[Counter], history_rows.StepChanges]:
        now = tx.db_now()
        counters = tx.usage_rows(partition, queue)
        changes = history_rows.step_changes(tx.conn, partition, queue, now - span.span, span.step)
        return now, counters, changes

    # One snapshot: the counters and the changes walked back from them must agree.
    now, counters, changes = engine.driver.run(read, isolation="REPEATABLE READ", read_only=True)
    in_use: dict[str, int] = {}
    reserved: dict[str, int] = {}
    limits: dict[str, int] = {}
    for counter in counters:
        if counter.scope_type == SUBTREE and counter.limit is not None:
            limits[counter.resource] = counter.limit
        elif counter.scope_type == QUEUE:
            in_use[counter.resource] = in_use.get(counter.resource, 0) + counter.in_use
            reserved[counter.resource] = reserved.get(counter.resource, 0) + counter.reserved
    return history.rebuild(
        partition=partition,
        queue=queue,
        window=span,
        now=now,
        in_use=in_use,
        reserved=reserved,
        limits=limits,
        in_use_changes=changes.in_use,
        reserved_changes=changes.reserved,
    )


def reservation_ids(engine: QuotaEngine, prefix: str, limit: int) -> list[str]:
    """Up to ``limit`` reservation ids starting with ``prefix`` (see :mod:`quota_ledger.model.short_ids`)."""
    return engine.driver.run(lambda tx: reads.ids_with_prefix(tx.conn, prefix, limit))


def expired_backlog(engine: QuotaEngine) -> int:
    """Pending reservations whose time ran out, in every partition: what a sweep has to do."""
    return engine.driver.run(lambda tx: reads.expired_backlog(tx.conn))
