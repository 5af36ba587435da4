"""The general path's hot statements on PostgreSQL, run straight on the psycopg cursor.

What the server-side functions (:mod:`quota_ledger.driver.pg_functions`) decline runs through
:class:`~quota_ledger.driver.tx.LedgerTx`. SQLAlchemy Core costs about 90 µs of Python per
statement; psycopg's cursor about 20 µs, and psycopg prepares a statement after a few uses
(measured with the functions off, reserve+commit on 1 and 8 threads, plain and with users and
applications: Core did 0.4-0.9x the pairs/s and used 1.7-2.2x the client CPU per pair). Each
``PG_*`` statement sits beside the Core statement it mirrors, in the module of its table
family, and locks exactly what that one locks; SQLite and MariaDB run the Core one. Arrays
(``ANY``, ``unnest``) keep every step a single statement whatever the number of resources.
Errors are re-raised as SQLAlchemy's ``DBAPIError`` so the driver classifies and retries them
exactly as on the Core path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, exc

if TYPE_CHECKING:
    from psycopg import Connection as PsycopgConnection
    from psycopg import Cursor

# psycopg is imported when a statement runs, not with this module: a ledger on SQLite or MariaDB
# never loads it (the command line starts about 40 ms sooner). On PostgreSQL it is loaded by then.


@dataclass(frozen=True, slots=True)
class Call:
    """One statement of a pipeline: its SQL and parameters."""

    sql: str
    params: Mapping[str, Any]


class PgCursor:
    """Runs ``PG_*`` statements on the connection's own psycopg cursor."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._cursor: Cursor[Any] | None = None

    def _cur(self) -> Cursor[Any]:
        if self._cursor is None:
            from psycopg.rows import namedtuple_row

            raw: PsycopgConnection[Any] = self._conn.connection.driver_connection  # type: ignore[assignment]
            self._cursor = raw.cursor(row_factory=namedtuple_row)
        return self._cursor

    def all(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        cur = self.run(sql, params)
        return cur.fetchall()

    def run(self, sql: str, params: Mapping[str, Any]) -> Cursor[Any]:
        from psycopg import Error as PsycopgError

        try:
            return self._cur().execute(sql, params)
        except PsycopgError as error:
            closed = self._conn.connection.driver_connection.closed  # type: ignore[union-attr]
            if closed:
                self._conn.invalidate(error)
            raise exc.DBAPIError.instance(sql, dict(params), error, PsycopgError) from error

    def pipelined(self, calls: Sequence[Call]) -> list[list[Any]]:
        """Run ``calls`` in order in one round trip (psycopg's pipeline mode); each one's rows.
        An error ends the pipeline: the statements after it do not run."""
        from psycopg import Error as PsycopgError
        from psycopg.rows import namedtuple_row

        raw: PsycopgConnection[Any] = self._conn.connection.driver_connection  # type: ignore[assignment]
        sql = calls[0].sql if calls else ""
        try:
            cursors = [raw.cursor(row_factory=namedtuple_row) for _ in calls]
            with raw.pipeline():  # leaving it sends the statements and reads every result
                for cursor, call in zip(cursors, calls, strict=True):
                    sql = call.sql
                    cursor.execute(call.sql, call.params)
            return [cursor.fetchall() for cursor in cursors]
        except PsycopgError as error:
            if raw.closed:
                self._conn.invalidate(error)
            raise exc.DBAPIError.instance(sql, {}, error, PsycopgError) from error
