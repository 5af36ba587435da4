"""Application rows (``quota_applications``) and finished applications' summaries
(``quota_app_summaries``). Application rows are locked sorted by ``app_key``, after the
reservation rows and before any counter (see the lock order in :mod:`.tx`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select, update
from sqlalchemy import insert as sa_insert

from quota_ledger.driver import inline
from quota_ledger.driver.counters import force_index
from quota_ledger.driver.pg_cursor import PgCursor
from quota_ledger.driver.schema import quota_app_summaries, quota_applications
from quota_ledger.model.tracking import AppState

_A = quota_applications.c
_S = quota_app_summaries.c
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
_PG_APP = (
    'id, "partition", app_key, application, user_name, queue, group_name, state, pending, "usage", area,'
    " submitted_at, started_at, finished_at, changed_at"
)
# lock_apps: application rows by key, sorted (step 4).
_LOCK_APPS = force_index(
    select(*_APP_COLUMNS)
    .where(_A.partition == bindparam("p"), _A.app_key.in_(bindparam("keys", expanding=True)))
    .order_by(_A.app_key)
    .with_for_update(),
    quota_applications,
    _APP_INDEX,
)
PG_LOCK_APPS = (
    f'SELECT {_PG_APP} FROM quota_applications WHERE "partition" = %(p)s'  # noqa: S608 - constants only
    " AND app_key = ANY(%(keys)s) ORDER BY app_key FOR UPDATE"
)
# lock_all_apps: every application row of a partition, sorted (config apply, step 4).
_LOCK_ALL_APPS = force_index(
    select(*_APP_COLUMNS).where(_A.partition == bindparam("p")).order_by(_A.app_key).with_for_update(),
    quota_applications,
    _APP_INDEX,
)
# app_keys_of_names: candidate keys of several users, and of several groups, each by its own
# index (one condition over both columns read every row of the partition on SQLite and
# MariaDB); no lock (locked by key next).
_KEYS_OF_USERS = select(_A.app_key).where(
    _A.partition == bindparam("p"), _A.user_name.in_(bindparam("names", expanding=True))
)
_KEYS_OF_GROUPS = select(_A.app_key).where(
    _A.partition == bindparam("p"), _A.group_name.in_(bindparam("names", expanding=True))
)
# read_apps_*: reports; no lock.
_APPS_OF_USER = select(*_APP_COLUMNS).where(_A.partition == bindparam("p"), _A.user_name == bindparam("n"))
_APPS_OF_GROUP = select(*_APP_COLUMNS).where(_A.partition == bindparam("p"), _A.group_name == bindparam("n"))
_ALL_APPS = select(*_APP_COLUMNS).where(_A.partition == bindparam("p"))
_INSERT_APP = sa_insert(quota_applications)
#: rows one update_apps statement writes at most; more take one statement per slice
ADD_SLICE = 32
#: the columns update_app and update_apps write, by the name of their parameter
_WRITTEN = {
    "v_user": _A.user_name,
    "v_queue": _A.queue,
    "v_group": _A.group_name,
    "v_state": _A.state,
    "v_pending": _A.pending,
    "v_usage": _A.usage,
    "v_area": _A.area,
    "v_submitted": _A.submitted_at,
    "v_started": _A.started_at,
    "v_finished": _A.finished_at,
    "v_changed": _A.changed_at,
}
# update_app: an application row this transaction holds.
_UPDATE_APP = (
    update(quota_applications)
    .where(_A.id == bindparam("aid"))
    .values({column.key: bindparam(name) for name, column in _WRITTEN.items()})
)


PG_UPDATE_APP = (
    "UPDATE quota_applications SET user_name = %(v_user)s, queue = %(v_queue)s,"
    " group_name = %(v_group)s, state = %(v_state)s,"
    ' pending = %(v_pending)s, "usage" = %(v_usage)s, area = %(v_area)s,'
    " submitted_at = %(v_submitted)s, started_at = %(v_started)s, finished_at = %(v_finished)s,"
    " changed_at = %(v_changed)s WHERE id = %(aid)s"
)
_INSERT_SUMMARY = sa_insert(quota_app_summaries)
_LATEST_SUMMARY = (
    select(_S.summary)
    .where(_S.partition == bindparam("p"), _S.application == bindparam("a"))
    .order_by(_S.id.desc())
    .limit(1)
)


class AppStatements:
    """The statements above, as methods of :class:`~quota_ledger.driver.tx.LedgerTx`."""

    conn: Connection
    pg: PgCursor | None
    deferred: list[inline.Statement] | None

    def lock_apps(self, partition: str, keys: Iterable[str]) -> dict[str, AppState]:
        wanted = sorted(set(keys))
        if not wanted:
            return {}
        params = {"p": partition, "keys": wanted}
        if self.pg is not None:
            rows: Iterable[Any] = self.pg.all(PG_LOCK_APPS, params)
        else:
            rows = self.conn.execute(_LOCK_APPS, params)
        return {app.app_key: app for app in map(_app, rows)}

    def lock_all_apps(self, partition: str) -> list[AppState]:
        return [_app(row) for row in self.conn.execute(_LOCK_ALL_APPS, {"p": partition})]

    def app_keys_of_names(self, partition: str, users: Iterable[str], groups: Iterable[str]) -> list[str]:
        """The keys of every application row of ``users`` or tracked against ``groups``."""
        keys: list[str] = []
        for stmt, names in ((_KEYS_OF_USERS, users), (_KEYS_OF_GROUPS, groups)):
            if wanted := sorted(set(names)):
                keys += self.conn.execute(stmt, {"p": partition, "names": wanted}).scalars()
        return keys

    def read_apps(self, partition: str, kind: str | None = None, name: str | None = None) -> list[AppState]:
        if kind is None:
            rows = self.conn.execute(_ALL_APPS, {"p": partition})
        else:
            stmt = _APPS_OF_USER if kind == "user" else _APPS_OF_GROUP
            rows = self.conn.execute(stmt, {"p": partition, "n": name})
        return [_app(row) for row in rows]

    def insert_app(self, app: AppState) -> None:
        result = self.conn.execute(_INSERT_APP, _new_app_values(app))
        app.id = int(result.inserted_primary_key[0])  # type: ignore[index]

    def insert_apps(self, apps: Iterable[AppState]) -> None:
        """Insert new application rows with one multi-row insert (their ids are not read back)."""
        rows = [_new_app_values(app) for app in apps]
        if rows:
            self.conn.execute(_INSERT_APP, rows)

    def update_apps(self, apps: Iterable[AppState]) -> None:
        """Write application rows this transaction holds: on MariaDB and SQLite one statement
        per :data:`ADD_SLICE` rows, each column a CASE on the id, written as the driver's own
        text (see :mod:`.inline`); not an ``executemany``, which PyMySQL runs as a round trip
        per row. On PostgreSQL one statement a row, on the psycopg cursor."""
        rows = sorted((app for app in apps), key=lambda app: app.id or 0)
        if self.pg is not None:
            for app in rows:
                self.update_app(app)
            return
        statements = [
            _update_many(self.conn, [_update_params(app) for app in rows[start : start + ADD_SLICE]])
            for start in range(0, len(rows), ADD_SLICE)
        ]
        inline.write(self.conn, self.deferred, statements)

    def update_app(self, app: AppState) -> None:
        params = _update_params(app)
        if self.pg is not None:
            self.pg.run(PG_UPDATE_APP, params)
        else:
            self.conn.execute(_UPDATE_APP, params)

    def insert_summaries(self, summaries: Sequence[Mapping[str, Any]], finished_at: datetime) -> None:
        """Insert finished applications' summaries (each names its partition and application):
        on MariaDB and SQLite one multi-row insert (see :mod:`.inline`)."""
        rows = [
            {
                "partition": summary["partition"],
                "application": summary["appId"],
                "summary": json.dumps(summary, sort_keys=True),
                "finished_at": finished_at,
            }
            for summary in summaries
        ]
        if not rows:
            return
        if self.pg is not None:
            self.conn.execute(_INSERT_SUMMARY, rows)
            return
        inline.write(self.conn, self.deferred, [inline.insert_rows(self.conn, quota_app_summaries, rows)])

    def latest_summary(self, partition: str, application: str) -> dict[str, Any] | None:
        text = self.conn.execute(_LATEST_SUMMARY, {"p": partition, "a": application}).scalar()
        return None if text is None else json.loads(text)


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


def _new_app_values(app: AppState) -> dict[str, Any]:
    values = _app_values(app)
    values.update(partition=app.partition, app_key=app.app_key, application=app.application)
    values.update(user_name=app.user, queue=app.queue)
    return values


def _update_many(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> inline.Statement:
    """update_apps of ``rows`` (:func:`_update_params`) as the driver's text and its positional
    parameters, each value as its column's type sends it."""
    m, quote = inline.marker(conn), conn.dialect.identifier_preparer.quote
    whens = " ".join([f"WHEN {m} THEN {m}"] * len(rows))
    sets: list[str] = []
    params: list[Any] = []
    for name, column in _WRITTEN.items():
        process = inline.sent(conn, column)
        sets.append(f"{quote(column.name)} = CASE id {whens} ELSE {quote(column.name)} END")
        for row in rows:
            params += [row["aid"], process(row[name])]
    ids = ",".join([m] * len(rows))
    params += [row["aid"] for row in rows]
    return f"UPDATE quota_applications SET {', '.join(sets)} WHERE id IN ({ids})", tuple(params)  # noqa: S608


def _update_params(app: AppState) -> dict[str, Any]:
    v = _app_values(app)
    return {
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
