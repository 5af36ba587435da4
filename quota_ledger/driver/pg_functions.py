"""Calls of the PostgreSQL functions that migration 0004 installs.

A reservation (creating, like the general path, the counters and the application row a first
use needs) is reserved and committed by one statement each, and a plain one (no user or
application) expired a batch at a time, run in autocommit as its own
transaction: ``quota_ledger_reserve``, ``quota_ledger_commit`` and ``quota_ledger_expire``.
They do exactly what the general path does for that case, in the same lock order. Anything
else they *decline* with SQLSTATE ``QL001`` before a change survives, and the engine runs the
general path, which stays the one source of truth for refusals and errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Engine, exc

# psycopg is imported by the call, not with this module: SQLite and MariaDB never load it.

#: SQLSTATE of a function that leaves the case to the general path
DECLINED = "QL001"
#: SQLSTATE of a function that does not exist (a schema before 0004)
UNDEFINED_FUNCTION = "42883"

RESERVE = (
    "SELECT quota_ledger_reserve(%(id)s, %(partition)s, %(key)s, %(request_hash)s, %(queue)s,"
    " %(resources)s::text[], %(amounts)s::bigint[], %(ttl_us)s, %(priority_class)s, %(kube)s,"
    " %(version)s, %(ns)s, %(k)s, %(quota_names)s::text[], %(quota_resources)s::text[],"
    " %(quota_amounts)s::bigint[], %(user)s, %(groups)s, %(application)s, %(app_key)s, %(group)s,"
    " %(id_kinds)s::text[], %(id_names)s::text[], %(id_queues)s::text[], %(id_resources)s::text[],"
    " %(id_amounts)s::bigint[], %(id_limits)s::bigint[])"
)
COMMIT = "SELECT * FROM quota_ledger_commit(%(id)s, %(op)s)"
# Inside a larger transaction (group commit, migration 0011): a decline returns NULL (no row).
TRY_RESERVE = RESERVE.replace("quota_ledger_reserve(", "quota_ledger_try_reserve(", 1)
TRY_COMMIT = COMMIT.replace("quota_ledger_commit(", "quota_ledger_try_commit(", 1)
# A batch's reserves of one partition, and its whole commits, as one call each (0012).
RESERVE_MANY = (
    "SELECT * FROM quota_ledger_reserve_many(%(partition)s, %(version)s, %(ns)s, %(k)s, %(ids)s::text[],"
    " %(keys)s::text[], %(request_hashes)s::text[], %(queues)s::text[], %(groups)s::text[],"
    " %(ttl_us)s::bigint[], %(priority_classes)s::text[], %(kubes)s::text[], %(users)s::text[],"
    " %(applications)s::text[], %(app_keys)s::text[], %(app_groups)s::text[], %(item_owners)s::integer[],"
    " %(item_resources)s::text[], %(item_amounts)s::bigint[], %(id_owners)s::integer[], %(id_kinds)s::text[],"
    " %(id_names)s::text[], %(id_queues)s::text[], %(id_resources)s::text[], %(id_amounts)s::bigint[],"
    " %(id_limits)s::bigint[], %(quota_owners)s::integer[], %(quota_names)s::text[],"
    " %(quota_resources)s::text[], %(quota_amounts)s::bigint[])"
)
COMMIT_MANY = "SELECT * FROM quota_ledger_commit_many(%(ids)s::text[], %(ops)s::text[], %(guard)s)"
# whether the functions a batch calls are installed (a schema at 0012 or later)
HAS_BATCH_FUNCTIONS = (
    "SELECT to_regproc('quota_ledger_try_commit') IS NOT NULL"
    " AND to_regproc('quota_ledger_try_reserve') IS NOT NULL"
    " AND to_regproc('quota_ledger_reserve_many') IS NOT NULL"
    " AND to_regproc('quota_ledger_commit_many') IS NOT NULL"
)
EXPIRE = "SELECT quota_ledger_expire(%(partition)s, %(limit)s, %(skip)s::text[], %(version)s, %(ns)s, %(k)s)"


def batch_functions_installed(conn: Connection) -> bool:
    """Whether the database has the functions a batch calls (a schema at 0012 or later)."""
    return bool(conn.exec_driver_sql(HAS_BATCH_FUNCTIONS).scalar())


class Unavailable(Exception):
    """The database has no ledger functions (its schema predates revision 0004)."""


def call(engine: Engine, sql: str, params: Mapping[str, Any]) -> list[Any] | None:
    """Run one function call as its own transaction; None when the function declined.

    Errors come back as SQLAlchemy's ``DBAPIError`` (with ``connection_invalidated`` set when
    the connection died), also when no connection could be opened, so the driver retries them
    exactly as it retries a transaction.
    """
    import psycopg
    from psycopg.rows import namedtuple_row

    try:
        proxied = engine.raw_connection()
    except psycopg.Error as error:
        # The pool hands out the driver's own error when it cannot connect (SQLAlchemy wraps
        # it only for engine.connect()): wrap it here so the driver retries it like any other.
        raise exc.DBAPIError.instance(sql, dict(params), error, psycopg.Error) from error
    try:
        raw: psycopg.Connection[Any] = proxied.driver_connection  # type: ignore[assignment]
        try:
            raw.autocommit = True
            try:
                with raw.cursor(row_factory=namedtuple_row) as cur:
                    return cur.execute(sql, params).fetchall()
            finally:
                if not raw.closed:
                    raw.autocommit = False
        except psycopg.Error as error:
            if error.sqlstate == DECLINED:
                return None
            if error.sqlstate == UNDEFINED_FUNCTION:
                raise Unavailable() from error
            dead = bool(raw.closed)
            if dead:
                proxied.invalidate(error)
            raise exc.DBAPIError.instance(
                sql, dict(params), error, psycopg.Error, connection_invalidated=dead
            ) from error
    finally:
        proxied.close()
