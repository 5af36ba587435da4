"""The general path on PostgreSQL: named SQL run straight on the psycopg cursor.

What the server-side functions (:mod:`quota_ledger.driver.pg_functions`) decline runs here.
SQLAlchemy Core costs about 90 µs of Python per statement; psycopg's cursor about 20 µs, and
psycopg prepares a statement after a few uses. Each statement below mirrors the Core statement
of the same name in :mod:`quota_ledger.driver.statements` (which SQLite and MariaDB use) and
locks exactly what that one locks. Arrays (``ANY``, ``unnest``) keep every step a single
statement whatever the number of resources. Errors are re-raised as SQLAlchemy's ``DBAPIError``
so the driver classifies and retries them exactly as on the Core path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psycopg import Connection as PsycopgConnection
from psycopg import Cursor
from psycopg import Error as PsycopgError
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, exc

_HEADER = (
    'r.id, r."partition", r."key", r.request_hash, r.state, r.queue, r.user_name, r."groups",'
    " r.application, r.priority_class, r.created_at, r.expires_at, r.resolved_at, r.kube, r.released_at,"
    " i.resource, i.amount, i.committed"
)
_COUNTER = "id, scope_type, scope, resource, in_use, reserved, hard_limit"
_IDENTITY = "id, kind, name, queue, resource, in_use, reserved, hard_limit"
_APP = (
    'id, "partition", app_key, application, user_name, queue, group_name, state, pending, "usage", area,'
    " submitted_at, started_at, finished_at, changed_at"
)

SQL: Mapping[str, str] = {
    # shared partition lock (advisory, nothing written) and the clock
    "lock_partition_shared": (
        "SELECT pg_advisory_xact_lock_shared(%(ns)s, %(k)s), TIMEZONE('UTC', clock_timestamp())"
    ),
    # idempotency lookup; no lock
    "find_reservation_by_key": (
        f"SELECT {_HEADER} FROM reservations r LEFT JOIN reservation_items i ON i.reservation_id = r.id"  # noqa: S608 - constants only
        ' WHERE r."partition" = %(p)s AND r."key" = %(key)s'
    ),
    # locks one reservation header row (step 2) and reads the clock
    "lock_reservation": (
        f"SELECT {_HEADER}, TIMEZONE('UTC', clock_timestamp()) AS db_now"  # noqa: S608 - constants only
        " FROM reservations r LEFT JOIN reservation_items i ON i.reservation_id = r.id"
        " WHERE r.id = %(id)s FOR UPDATE OF r"
    ),
    # the sweep: locks up to :n expired pending reservations nobody else holds (step 2) and
    # returns them with their items, in one statement; :now is bound so the index is usable
    "lock_expired": (
        "WITH locked AS (SELECT id FROM reservations"  # noqa: S608 - constants only
        " WHERE \"partition\" = %(p)s AND state = 'pending' AND expires_at <= %(now)s"
        " ORDER BY expires_at LIMIT %(n)s FOR UPDATE SKIP LOCKED)"
        f" SELECT {_HEADER} FROM locked JOIN reservations r ON r.id = locked.id"
        " LEFT JOIN reservation_items i ON i.reservation_id = r.id"
    ),
    # reservation rows this transaction holds
    "expire_reservations": (
        "UPDATE reservations SET state = 'expired', resolved_at = %(now)s"
        " WHERE id = ANY(%(ids)s) AND state = 'pending'"
    ),
    # new rows only
    "insert_reservation": (
        'INSERT INTO reservations (id, "partition", "key", request_hash, state, queue, user_name,'
        ' "groups", application, priority_class, created_at, expires_at, resolved_at, kube)'
        " VALUES (%(id)s, %(partition)s, %(key)s, %(request_hash)s, %(state)s, %(queue)s,"
        " %(user_name)s, %(groups)s, %(application)s, %(priority_class)s, %(created_at)s,"
        " %(expires_at)s, NULL, %(kube)s)"
    ),
    "insert_items": (
        "INSERT INTO reservation_items (reservation_id, resource, amount)"
        " SELECT %(rid)s, t.resource, t.amount"
        " FROM unnest(%(resources)s::text[], %(amounts)s::bigint[]) AS t(resource, amount)"
    ),
    # queue counters of the given scopes x resources, in canonical order (step 3)
    "lock_queue_counters": (
        f"SELECT {_COUNTER} FROM quota_usages WHERE \"partition\" = %(p)s AND scope_type = 'queue'"  # noqa: S608
        " AND scope = ANY(%(scopes)s) AND resource = ANY(%(resources)s)"
        " ORDER BY scope, resource FOR UPDATE"
    ),
    # limits on the given scopes x resources, in canonical order (step 4)
    "lock_subtree_counters": (
        f"SELECT {_COUNTER} FROM quota_usages WHERE \"partition\" = %(p)s AND scope_type = 'subtree'"  # noqa: S608
        " AND scope = ANY(%(scopes)s) AND resource = ANY(%(resources)s)"
        " ORDER BY scope, resource FOR UPDATE"
    ),
    # counters this transaction holds
    "apply_counter_deltas": (
        "UPDATE quota_usages SET in_use = quota_usages.in_use + d.di,"
        " reserved = quota_usages.reserved + d.dr, updated_at = %(now)s"
        " FROM unnest(%(ids)s::bigint[], %(dis)s::bigint[], %(drs)s::bigint[]) AS d(id, di, dr)"
        " WHERE quota_usages.id = d.id"
    ),
    # a reservation row this transaction holds
    "resolve_reservation": (
        "UPDATE reservations SET state = %(new_state)s, resolved_at = %(now)s"
        " WHERE id = %(rid)s AND state = 'pending'"
    ),
    "commit_all_items": ("UPDATE reservation_items SET committed = amount WHERE reservation_id = %(rid)s"),
    # new rows only
    "append_journal": (
        'INSERT INTO quota_journal ("partition", queue, resource, delta, kind, reservation_id,'
        " operation_id, created_at)"
        " SELECT %(p)s, %(q)s, t.resource, t.delta, %(kind)s, %(rid)s, %(op)s, %(now)s"
        " FROM unnest(%(resources)s::text[], %(deltas)s::bigint[]) AS t(resource, delta)"
    ),
    # -- applications and user/group counters (see tracking.py) --------------------------------
    # the configuration version in force; no lock
    "config_version": "SELECT version FROM quota_config_head WHERE id = 1",
    # application rows by key, sorted (step 4)
    "lock_apps": (
        f'SELECT {_APP} FROM quota_applications WHERE "partition" = %(p)s'  # noqa: S608 - constants only
        " AND app_key = ANY(%(keys)s) ORDER BY app_key FOR UPDATE"
    ),
    # an application row this transaction holds
    "update_app": (
        "UPDATE quota_applications SET user_name = %(v_user)s, queue = %(v_queue)s,"
        " group_name = %(v_group)s, state = %(v_state)s,"
        ' pending = %(v_pending)s, "usage" = %(v_usage)s, area = %(v_area)s,'
        " submitted_at = %(v_submitted)s, started_at = %(v_started)s, finished_at = %(v_finished)s,"
        " changed_at = %(v_changed)s WHERE id = %(aid)s"
    ),
    # user/group counters of kinds x names x queues x resources, in canonical order (step 7)
    "lock_identity_counters": (
        f'SELECT {_IDENTITY} FROM quota_identity_usages WHERE "partition" = %(p)s'  # noqa: S608
        " AND kind = ANY(%(kinds)s) AND name = ANY(%(names)s) AND queue = ANY(%(queues)s)"
        " AND resource = ANY(%(resources)s) ORDER BY kind, name, queue, resource FOR UPDATE"
    ),
    # user/group counters this transaction holds
    "apply_identity_deltas": (
        "UPDATE quota_identity_usages SET in_use = quota_identity_usages.in_use + d.di,"
        " reserved = quota_identity_usages.reserved + d.dr, updated_at = %(now)s"
        " FROM unnest(%(ids)s::bigint[], %(dis)s::bigint[], %(drs)s::bigint[]) AS d(id, di, dr)"
        " WHERE quota_identity_usages.id = d.id"
    ),
}


class FastPath:
    """Runs the statements above on the connection's own psycopg cursor."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._cursor: Cursor[Any] | None = None

    def _cur(self) -> Cursor[Any]:
        if self._cursor is None:
            raw: PsycopgConnection[Any] = self._conn.connection.driver_connection  # type: ignore[assignment]
            self._cursor = raw.cursor(row_factory=namedtuple_row)
        return self._cursor

    def all(self, name: str, params: Mapping[str, Any]) -> list[Any]:
        cur = self.run(name, params)
        return cur.fetchall()

    def run(self, name: str, params: Mapping[str, Any]) -> Cursor[Any]:
        sql = SQL[name]
        try:
            return self._cur().execute(sql, params)
        except PsycopgError as error:
            closed = self._conn.connection.driver_connection.closed  # type: ignore[union-attr]
            if closed:
                self._conn.invalidate(error)
            raise exc.DBAPIError.instance(sql, dict(params), error, PsycopgError) from error
