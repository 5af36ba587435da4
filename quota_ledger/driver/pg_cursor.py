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
    """One statement of a pipeline: its SQL and parameters. ``arrays_as_text``: its SQL casts
    every array parameter (``%(x)s::text[]``), so lists are sent in PostgreSQL's text form."""

    sql: str
    params: Mapping[str, Any]
    arrays_as_text: bool = False

    def sent(self) -> Mapping[str, Any]:
        """The parameters as they are sent."""
        return with_text_arrays(self.params) if self.arrays_as_text else self.params


def with_text_arrays(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with each list or tuple of strings, integers and None in PostgreSQL's text
    form of an array (``{"a",NULL,3}``), for SQL that casts it (``%(x)s::text[]``).

    psycopg adapts a Python list element by element in Python, about 20 µs per list: a ledger
    function's 28 arrays cost more client time than the rest of a reserve. One string costs
    almost nothing to send, and the server parses it as it would the list.
    """
    return {k: array_text(v) if isinstance(v, list | tuple) else v for k, v in params.items()}


def array_text(values: Sequence[str | int | None]) -> str:
    """PostgreSQL's text form of a one-dimensional array: every string quoted, with its
    backslashes and double quotes escaped; None as ``NULL``."""
    return "{" + ",".join(map(_element, values)) + "}" if values else "{}"


def _element(value: str | int | None) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise TypeError(f"not an array element: {value!r}")


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
                    cursor.execute(call.sql, call.sent())
            return [cursor.fetchall() for cursor in cursors]
        except PsycopgError as error:
            if raw.closed:
                self._conn.invalidate(error)
            raise exc.DBAPIError.instance(sql, {}, error, PsycopgError) from error
