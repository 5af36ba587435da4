"""Configuration versions (``quota_configs``, ``quota_config_changes``, ``quota_config_head``),
partition names and namespace placements (``quota_namespaces``). The config head row is step 1
of the lock order in :mod:`.tx`: only configuration writers take it.

A version is either a whole snapshot (a ``quota_configs`` row) or one queue's max changed over
the version before it (``quota_config_changes`` rows); loading version V replays the changes in
(newest snapshot <= V, V] over that snapshot."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, func, select, update
from sqlalchemy import insert as sa_insert

from quota_ledger.config import queue_max
from quota_ledger.config.queue_max import LimitChange
from quota_ledger.driver.pg_cursor import PgCursor
from quota_ledger.driver.schema import (
    quota_config_changes,
    quota_config_head,
    quota_configs,
    quota_namespaces,
    quota_partitions,
)

_H = quota_config_head.c
_C = quota_configs.c
_X = quota_config_changes.c
_N = quota_namespaces.c

# config_version: the version in force; no lock (read under the partition lock).
_CONFIG_VERSION = select(_H.version).where(_H.id == 1)
PG_CONFIG_VERSION = "SELECT version FROM quota_config_head WHERE id = 1"
# lock_config_head: serializes config writers (step 1).
_LOCK_CONFIG_HEAD = _CONFIG_VERSION.with_for_update()
_LOAD_CONFIG = select(_C.document, _C.capacity, _C.kube).where(_C.version == bindparam("v"))
_INSERT_CONFIG = sa_insert(quota_configs)
# newest_snapshot: the newest whole snapshot at or below a version; no lock.
_NEWEST_SNAPSHOT = select(func.max(_C.version)).where(_C.version <= bindparam("v"))
# snapshot_between: the newest whole snapshot in (lo, hi]; no lock.
_SNAPSHOT_BETWEEN = select(func.max(_C.version)).where(
    _C.version > bindparam("lo"), _C.version <= bindparam("hi")
)
# config_changes: the changes of versions in (lo, hi], oldest first; no lock.
_CHANGES = (
    select(_X.version, _X.partition, _X.queue, _X.resource, _X.hard_limit)
    .where(_X.version > bindparam("lo"), _X.version <= bindparam("hi"))
    .order_by(_X.version, _X.partition, _X.queue, _X.resource)
)
_INSERT_CHANGE = sa_insert(quota_config_changes)
# partition_names: every partition with a row; no lock.
_PARTITION_NAMES = select(quota_partitions.c.name).order_by(quota_partitions.c.name)
_SET_HEAD = update(quota_config_head).where(_H.id == 1).values(version=bindparam("v"))

# -- namespaces -------------------------------------------------------------------------------
# namespace_queue: where a namespace is placed; no lock.
_NAMESPACE_QUEUE = select(_N.queue).where(_N.partition == bindparam("p"), _N.namespace == bindparam("ns"))
_DELETE_NAMESPACE = delete(quota_namespaces).where(
    _N.partition == bindparam("p"), _N.namespace == bindparam("ns")
)
_INSERT_NAMESPACE = sa_insert(quota_namespaces)


class ConfigStatements:
    """The statements above, as methods of :class:`~quota_ledger.driver.tx.LedgerTx`."""

    conn: Connection
    pg: PgCursor | None

    def config_version(self) -> int:
        if self.pg is not None:
            return int(self.pg.all(PG_CONFIG_VERSION, {})[0][0])
        return int(self.conn.execute(_CONFIG_VERSION).scalar_one())

    def lock_config_head(self) -> int:
        return int(self.conn.execute(_LOCK_CONFIG_HEAD).scalar_one())

    def load_config(self, version: int) -> tuple[dict[str, Any], dict[str, dict[str, int]], dict[str, Any]]:
        """(YuniKorn document, root capacity, Kubernetes objects) of a version."""
        snapshot = int(self.conn.execute(_NEWEST_SNAPSHOT, {"v": version}).scalar_one())
        row = self.conn.execute(_LOAD_CONFIG, {"v": snapshot}).one()
        document, capacity = json.loads(row.document), json.loads(row.capacity)
        if snapshot != version:
            changes = self._changes(snapshot, version)
            document, capacity = queue_max.replay(document, capacity, changes)
        return document, capacity, json.loads(row.kube)

    def changes_since(self, after: int, version: int) -> list[LimitChange] | None:
        """The changes that make ``version`` from version ``after``, oldest first; None when a
        whole snapshot was stored in between (the version must be loaded whole)."""
        if self.conn.execute(_SNAPSHOT_BETWEEN, {"lo": after, "hi": version}).scalar() is not None:
            return None
        return self._changes(after, version)

    def _changes(self, after: int, version: int) -> list[LimitChange]:
        rows = self.conn.execute(_CHANGES, {"lo": after, "hi": version})
        return [LimitChange(r.version, r.partition, r.queue, r.resource, r.hard_limit) for r in rows]

    def store_changes(
        self, version: int, partition: str, queue: str, limits: Mapping[str, int | None], now: datetime
    ) -> None:
        """Record ``queue``'s new max (None: removed) as ``version`` and make it the one in force."""
        rows = [
            {
                "version": version,
                "partition": partition,
                "queue": queue,
                "resource": resource,
                "hard_limit": limit,
                "created_at": now,
            }
            for resource, limit in sorted(limits.items())
        ]
        self.conn.execute(_INSERT_CHANGE, rows)
        self.conn.execute(_SET_HEAD, {"v": version})

    def store_config(
        self,
        version: int,
        document: Mapping[str, Any],
        capacity: Mapping[str, Any],
        kube: Mapping[str, Any],
        now: datetime,
    ) -> None:
        self.conn.execute(
            _INSERT_CONFIG,
            {
                "version": version,
                "document": json.dumps(document, sort_keys=True),
                "capacity": json.dumps(capacity, sort_keys=True),
                "kube": json.dumps(kube, sort_keys=True),
                "created_at": now,
            },
        )
        self.conn.execute(_SET_HEAD, {"v": version})

    def partition_names(self) -> list[str]:
        return list(self.conn.execute(_PARTITION_NAMES).scalars())

    def namespace_queue(self, partition: str, namespace: str) -> str | None:
        found = self.conn.execute(_NAMESPACE_QUEUE, {"p": partition, "ns": namespace}).scalar()
        return None if found is None else str(found)

    def place_namespace(self, partition: str, namespace: str, queue: str, now: datetime) -> None:
        """Record a namespace's queue (the caller holds the config head lock)."""
        self.conn.execute(_DELETE_NAMESPACE, {"p": partition, "ns": namespace})
        row = {"partition": partition, "namespace": namespace, "queue": queue, "updated_at": now}
        self.conn.execute(_INSERT_NAMESPACE, row)
