"""Statements for configurations, user/group counters and application rows.

Lock order, continuing the one in :mod:`quota_ledger.driver.statements`:

1. the config head row (config writers only), 2. partition lock, 3. reservation rows,
4. application rows, sorted by ``app_key``, 5. queue counters, 6. subtree counters,
7. user/group counters (``quota_identity_usages``), sorted by (kind, name, queue, resource).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, bindparam, delete, or_, select, update
from sqlalchemy import insert as sa_insert

from quota_ledger.driver import dialect
from quota_ledger.driver.pg_fast import FastPath
from quota_ledger.driver.schema import (
    quota_app_summaries,
    quota_applications,
    quota_config_head,
    quota_configs,
    quota_identity_usages,
    quota_namespaces,
    quota_partitions,
    reservations,
)
from quota_ledger.model.limits import Counter
from quota_ledger.model.tracking import AppState

_H = quota_config_head.c
_C = quota_configs.c
_D = quota_identity_usages.c
_A = quota_applications.c
_S = quota_app_summaries.c


def _hint(stmt: Any, table: Any, index: str) -> Any:
    # MariaDB locks rows in scan order: force the unique index so it scans in sorted order.
    for name in ("mysql", "mariadb"):
        stmt = stmt.with_hint(table, f"FORCE INDEX ({index})", dialect_name=name)
    return stmt


# -- configuration ----------------------------------------------------------------------------
# config_version: the version in force; no lock (read under the partition lock).
_CONFIG_VERSION = select(_H.version).where(_H.id == 1)
# lock_config_head: serializes config writers (step 1).
_LOCK_CONFIG_HEAD = _CONFIG_VERSION.with_for_update()
_LOAD_CONFIG = select(_C.document, _C.capacity, _C.kube).where(_C.version == bindparam("v"))
_INSERT_CONFIG = sa_insert(quota_configs)
# partition_names: every partition with a row; no lock.
_PARTITION_NAMES = select(quota_partitions.c.name).order_by(quota_partitions.c.name)
_SET_HEAD = update(quota_config_head).where(_H.id == 1).values(version=bindparam("v"))

# -- user/group counters ----------------------------------------------------------------------
_IDENTITY_COLUMNS = (_D.id, _D.kind, _D.name, _D.queue, _D.resource, _D.in_use, _D.reserved, _D.hard_limit)
_IDENTITY_INDEX = "uq_quota_identity_usages_partition_kind_name_queue_resource"
# lock_identity_counters: the counters of kinds x names x queues x resources (step 7).
_LOCK_IDENTITY = _hint(
    select(*_IDENTITY_COLUMNS)
    .where(
        _D.partition == bindparam("p"),
        _D.kind.in_(bindparam("kinds", expanding=True)),
        _D.name.in_(bindparam("names", expanding=True)),
        _D.queue.in_(bindparam("queues", expanding=True)),
        _D.resource.in_(bindparam("resources", expanding=True)),
    )
    .order_by(_D.kind, _D.name, _D.queue, _D.resource)
    .with_for_update(),
    quota_identity_usages,
    _IDENTITY_INDEX,
)
# all_identity_counters: every counter of some kinds in a partition; no lock.
_ALL_IDENTITY = (
    select(*_IDENTITY_COLUMNS)
    .where(_D.partition == bindparam("p"), _D.kind.in_(bindparam("kinds", expanding=True)))
    .order_by(_D.kind, _D.name, _D.queue, _D.resource)
)
# lock_all_identity_counters: the same, locked (config apply and audit fix, step 7).
_LOCK_ALL_IDENTITY = _hint(_ALL_IDENTITY.with_for_update(), quota_identity_usages, _IDENTITY_INDEX)
_APPLY_IDENTITY = (
    update(quota_identity_usages)
    .where(_D.id == bindparam("cid"))
    .values(
        in_use=_D.in_use + bindparam("d_in_use"),
        reserved=_D.reserved + bindparam("d_reserved"),
        updated_at=bindparam("now"),
    )
)
_SET_IDENTITY = (
    update(quota_identity_usages)
    .where(_D.id == bindparam("cid"))
    .values(
        in_use=bindparam("v_in_use"),
        reserved=bindparam("v_reserved"),
        hard_limit=bindparam("lim"),
        updated_at=bindparam("now"),
    )
)
_DELETE_IDENTITY = delete(quota_identity_usages).where(_D.id.in_(bindparam("ids", expanding=True)))

# -- applications -----------------------------------------------------------------------------
_APP_COLUMNS = (
    _A.id,
    _A.partition,
    _A.app_key,
    _A.application,
    _A.user_name,
    _A.queue,
    _A.group_name,
    _A.state,
    _A.pending,
    _A.usage,
    _A.area,
    _A.submitted_at,
    _A.started_at,
    _A.finished_at,
    _A.changed_at,
)
_APP_INDEX = "uq_quota_applications_partition_app_key"
# lock_apps: application rows by key, sorted (step 4).
_LOCK_APPS = _hint(
    select(*_APP_COLUMNS)
    .where(_A.partition == bindparam("p"), _A.app_key.in_(bindparam("keys", expanding=True)))
    .order_by(_A.app_key)
    .with_for_update(),
    quota_applications,
    _APP_INDEX,
)
# lock_all_apps: every application row of a partition, sorted (config apply, step 4).
_LOCK_ALL_APPS = _hint(
    select(*_APP_COLUMNS).where(_A.partition == bindparam("p")).order_by(_A.app_key).with_for_update(),
    quota_applications,
    _APP_INDEX,
)
# app_keys_of_user / _of_group: candidate keys; no lock (they are locked by key next).
_KEYS_OF_USER = select(_A.app_key).where(_A.partition == bindparam("p"), _A.user_name == bindparam("n"))
_KEYS_OF_GROUP = select(_A.app_key).where(_A.partition == bindparam("p"), _A.group_name == bindparam("n"))
# read_apps_*: reports; no lock.
_APPS_OF_USER = select(*_APP_COLUMNS).where(_A.partition == bindparam("p"), _A.user_name == bindparam("n"))
_APPS_OF_GROUP = select(*_APP_COLUMNS).where(_A.partition == bindparam("p"), _A.group_name == bindparam("n"))
_ALL_APPS = select(*_APP_COLUMNS).where(_A.partition == bindparam("p"))
_INSERT_APP = sa_insert(quota_applications)
_UPDATE_APP = (
    update(quota_applications)
    .where(_A.id == bindparam("aid"))
    .values(
        user_name=bindparam("v_user"),
        queue=bindparam("v_queue"),
        group_name=bindparam("v_group"),
        state=bindparam("v_state"),
        pending=bindparam("v_pending"),
        usage=bindparam("v_usage"),
        area=bindparam("v_area"),
        submitted_at=bindparam("v_submitted"),
        started_at=bindparam("v_started"),
        finished_at=bindparam("v_finished"),
        changed_at=bindparam("v_changed"),
    )
)
_INSERT_SUMMARY = sa_insert(quota_app_summaries)
_LATEST_SUMMARY = (
    select(_S.summary)
    .where(_S.partition == bindparam("p"), _S.application == bindparam("a"))
    .order_by(_S.id.desc())
    .limit(1)
)


# -- live reservations (what ResourceQuota counters are the sum of) ---------------------------
_RV = reservations.c
_LIVE_WHERE = (
    _RV.partition == bindparam("p"),
    _RV.queue.in_(bindparam("queues", expanding=True)),
    or_(_RV.state == "pending", and_(_RV.state == "committed", _RV.released_at.is_(None))),
)
# read_live_reservations: pending and unreleased committed reservations of some queues; no lock.
_READ_LIVE = select(_RV.id, _RV.queue, _RV.kube).where(*_LIVE_WHERE).order_by(_RV.id)
# lock_live_reservations: the same, locked (quota changes, step 3: reservation rows).
_LOCK_LIVE = _READ_LIVE.with_for_update()
# mark_released: a committed reservation this transaction holds.
_MARK_RELEASED = (
    update(reservations)
    .where(_RV.id == bindparam("rid"), _RV.state == "committed", _RV.released_at.is_(None))
    .values(released_at=bindparam("now"))
)

# -- namespaces -------------------------------------------------------------------------------
_N = quota_namespaces.c
# namespace_queue: where a namespace is placed; no lock.
_NAMESPACE_QUEUE = select(_N.queue).where(_N.partition == bindparam("p"), _N.namespace == bindparam("ns"))
_DELETE_NAMESPACE = delete(quota_namespaces).where(
    _N.partition == bindparam("p"), _N.namespace == bindparam("ns")
)
_INSERT_NAMESPACE = sa_insert(quota_namespaces)


class TrackingStatements:
    """The statements above, as methods of :class:`~quota_ledger.driver.statements.LedgerTx`."""

    conn: Connection
    backend: str
    fast: FastPath | None

    # -- configuration ---------------------------------------------------------------------
    def config_version(self) -> int:
        if self.fast is not None:
            return int(self.fast.all("config_version", {})[0][0])
        return int(self.conn.execute(_CONFIG_VERSION).scalar_one())

    def lock_config_head(self) -> int:
        return int(self.conn.execute(_LOCK_CONFIG_HEAD).scalar_one())

    def load_config(self, version: int) -> tuple[dict[str, Any], dict[str, dict[str, int]], dict[str, Any]]:
        """(YuniKorn document, root capacity, Kubernetes objects) of a version."""
        row = self.conn.execute(_LOAD_CONFIG, {"v": version}).one()
        return json.loads(row.document), json.loads(row.capacity), json.loads(row.kube)

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

    def live_reservations(
        self, partition: str, queues: Iterable[str], *, lock: bool
    ) -> list[tuple[str, str, dict[str, Any] | None]]:
        """(id, queue, kube) of every pending or unreleased committed reservation in ``queues``."""
        queue_list = sorted(set(queues))
        if not queue_list:
            return []
        rows = self.conn.execute(_LOCK_LIVE if lock else _READ_LIVE, {"p": partition, "queues": queue_list})
        return [(row.id, row.queue, json.loads(row.kube) if row.kube else None) for row in rows]

    def mark_released(self, reservation_id: str, now: datetime) -> bool:
        return self.conn.execute(_MARK_RELEASED, {"rid": reservation_id, "now": now}).rowcount == 1

    def namespace_queue(self, partition: str, namespace: str) -> str | None:
        found = self.conn.execute(_NAMESPACE_QUEUE, {"p": partition, "ns": namespace}).scalar()
        return None if found is None else str(found)

    def place_namespace(self, partition: str, namespace: str, queue: str, now: datetime) -> None:
        """Record a namespace's queue (the caller holds the config head lock)."""
        self.conn.execute(_DELETE_NAMESPACE, {"p": partition, "ns": namespace})
        row = {"partition": partition, "namespace": namespace, "queue": queue, "updated_at": now}
        self.conn.execute(_INSERT_NAMESPACE, row)

    # -- user/group counters ---------------------------------------------------------------
    def lock_identity_counters(
        self,
        partition: str,
        names: Iterable[tuple[str, str]],
        queues: Iterable[str],
        resources: Iterable[str],
    ) -> list[Counter]:
        """Lock the user/group counters of (kind, name) pairs x queues x resources.

        The query takes the cross product of kinds and names; rows of a pair not asked for
        are locked too (in the same canonical order) but not returned.
        """
        pairs = set(names)
        queue_list, resource_list = sorted(set(queues)), sorted(set(resources))
        if not pairs or not queue_list or not resource_list:
            return []
        params = {
            "p": partition,
            "kinds": sorted({k for k, _ in pairs}),
            "names": sorted({n for _, n in pairs}),
            "queues": queue_list,
            "resources": resource_list,
        }
        if self.fast is not None:
            rows: Sequence[Any] = self.fast.all("lock_identity_counters", params)
        else:
            rows = self.conn.execute(_LOCK_IDENTITY, params).all()
        return [c for row in rows if ((c := _identity(row)).scope_type, c.name) in pairs]

    def identity_counters(
        self, partition: str, *, lock: bool, kinds: Iterable[str] = ("group", "user")
    ) -> list[Counter]:
        """Every counter of ``kinds`` in a partition. Locking order: user/group counters first,
        then (in a call of their own) ResourceQuota counters, on every path."""
        params = {"p": partition, "kinds": sorted(kinds)}
        rows = self.conn.execute(_LOCK_ALL_IDENTITY if lock else _ALL_IDENTITY, params)
        return [_identity(row) for row in rows]

    def apply_identity_deltas(self, deltas: Mapping[int, tuple[int, int]], now: datetime) -> None:
        changes = sorted((cid, d) for cid, d in deltas.items() if d[0] or d[1])
        if changes and self.fast is not None:
            self.fast.run(
                "apply_identity_deltas",
                {
                    "ids": [cid for cid, _ in changes],
                    "dis": [d[0] for _, d in changes],
                    "drs": [d[1] for _, d in changes],
                    "now": now,
                },
            )
        elif changes:
            self.conn.execute(
                _APPLY_IDENTITY,
                [{"cid": cid, "d_in_use": di, "d_reserved": dr, "now": now} for cid, (di, dr) in changes],
            )

    def set_identity_counters(self, values: Mapping[int, tuple[int, int, int]], now: datetime) -> None:
        """Set (in_use, reserved, limit) of locked counters."""
        params = [
            {"cid": cid, "v_in_use": i, "v_reserved": r, "lim": lim, "now": now}
            for cid, (i, r, lim) in sorted(values.items())
        ]
        if params:
            self.conn.execute(_SET_IDENTITY, params)

    def delete_identity_counters(self, ids: Sequence[int]) -> None:
        if ids:
            self.conn.execute(_DELETE_IDENTITY, {"ids": sorted(ids)})

    def insert_identity_counters(
        self, partition: str, rows: Mapping[tuple[str, str, str, str], tuple[int, int, int]], now: datetime
    ) -> None:
        """Create counters ``(kind, name, queue, resource) -> (in_use, reserved, limit)``,
        skipping any a concurrent transaction created first."""
        if not rows:
            return
        self.conn.execute(
            dialect.insert_ignoring_duplicates(self.backend, quota_identity_usages),
            [
                {
                    "partition": partition,
                    "kind": kind,
                    "name": name,
                    "queue": queue,
                    "resource": resource,
                    "in_use": in_use,
                    "reserved": reserved,
                    "hard_limit": limit,
                    "updated_at": now,
                }
                for (kind, name, queue, resource), (in_use, reserved, limit) in sorted(rows.items())
            ],
        )

    # -- applications ----------------------------------------------------------------------
    def lock_apps(self, partition: str, keys: Iterable[str]) -> dict[str, AppState]:
        wanted = sorted(set(keys))
        if not wanted:
            return {}
        params = {"p": partition, "keys": wanted}
        if self.fast is not None:
            rows: Iterable[Any] = self.fast.all("lock_apps", params)
        else:
            rows = self.conn.execute(_LOCK_APPS, params)
        return {app.app_key: app for app in map(_app, rows)}

    def lock_all_apps(self, partition: str) -> list[AppState]:
        return [_app(row) for row in self.conn.execute(_LOCK_ALL_APPS, {"p": partition})]

    def app_keys_of(self, partition: str, kind: str, name: str) -> list[str]:
        stmt = _KEYS_OF_USER if kind == "user" else _KEYS_OF_GROUP
        return list(self.conn.execute(stmt, {"p": partition, "n": name}).scalars())

    def read_apps(self, partition: str, kind: str | None = None, name: str | None = None) -> list[AppState]:
        if kind is None:
            rows = self.conn.execute(_ALL_APPS, {"p": partition})
        else:
            stmt = _APPS_OF_USER if kind == "user" else _APPS_OF_GROUP
            rows = self.conn.execute(stmt, {"p": partition, "n": name})
        return [_app(row) for row in rows]

    def insert_app(self, app: AppState) -> None:
        values = _app_values(app)
        values.update(partition=app.partition, app_key=app.app_key, application=app.application)
        values.update(user_name=app.user, queue=app.queue)
        result = self.conn.execute(_INSERT_APP, values)
        app.id = int(result.inserted_primary_key[0])  # type: ignore[index]

    def update_app(self, app: AppState) -> None:
        v = _app_values(app)
        params = {
            "aid": app.id,
            "v_user": app.user,
            "v_queue": app.queue,
            "v_group": v["group_name"],
            "v_state": v["state"],
            "v_pending": v["pending"],
            "v_usage": v["usage"],
            "v_area": v["area"],
            "v_submitted": v["submitted_at"],
            "v_started": v["started_at"],
            "v_finished": v["finished_at"],
            "v_changed": v["changed_at"],
        }
        if self.fast is not None:
            self.fast.run("update_app", params)
        else:
            self.conn.execute(_UPDATE_APP, params)

    def insert_summary(self, partition: str, summary: Mapping[str, Any], finished_at: datetime) -> None:
        self.conn.execute(
            _INSERT_SUMMARY,
            {
                "partition": partition,
                "application": summary["appId"],
                "summary": json.dumps(summary, sort_keys=True),
                "finished_at": finished_at,
            },
        )

    def latest_summary(self, partition: str, application: str) -> dict[str, Any] | None:
        text = self.conn.execute(_LATEST_SUMMARY, {"p": partition, "a": application}).scalar()
        return None if text is None else json.loads(text)


def _identity(row: Any) -> Counter:
    return Counter(
        id=row.id,
        scope_type=row.kind,
        scope=row.queue,
        resource=row.resource,
        in_use=row.in_use,
        reserved=row.reserved,
        limit=row.hard_limit,
        name=row.name,
    )


def _app(row: Any) -> AppState:
    return AppState(
        id=row.id,
        partition=row.partition,
        app_key=row.app_key,
        application=row.application,
        user=row.user_name,
        queue=row.queue,
        group=row.group_name,
        state=row.state,
        pending=row.pending,
        usage={res: list(v) for res, v in json.loads(row.usage).items()},
        area={res: int(v) for res, v in json.loads(row.area).items()},
        submitted_at=row.submitted_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        changed_at=row.changed_at,
    )


def _app_values(app: AppState) -> dict[str, Any]:
    return {
        "group_name": app.group,
        "state": app.state,
        "pending": app.pending,
        "usage": json.dumps(app.usage, sort_keys=True),
        # areas can pass 2^63 (bytes x microseconds): JSON strings keep them exact everywhere
        "area": json.dumps({res: str(v) for res, v in app.area.items()}, sort_keys=True),
        "submitted_at": app.submitted_at,
        "started_at": app.started_at,
        "finished_at": app.finished_at,
        "changed_at": app.changed_at,
    }
