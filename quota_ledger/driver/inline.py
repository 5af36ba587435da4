"""Statements written as the driver's own text, for MariaDB and SQLite.

A batch locks and adds to a hundred counters or more. Built as SQLAlchemy statements (an
expanding IN of a hundred row values, a CASE of a hundred ids), every value costs SQLAlchemy a
bind name and a parameter to process: about 1.5 ms for a lock of 160 user/group counters, in
Python, while the transaction holds counters that every other reservation of the partition
waits for. And every size of such a statement is a tree of a few thousand objects kept in a
cache, which Python's garbage collector walks on every full collection (about 200 ms once a
busy engine has met sixty sizes). Written as the driver's own text instead
(``exec_driver_sql``), a statement costs a string join and is not cached:

- values go as positional parameters, escaped by the driver (PyMySQL's ``%s``, sqlite3's
  ``?``);
- integers of a statement that holds nothing else may go into its text (``int.__repr__`` of a
  value checked to be an ``int``): they need no escaping.

On MariaDB the writes that end a set (its inserts and its counter updates) may go together as
one compound statement (``BEGIN NOT ATOMIC ...; END``): one round trip instead of one each, and
an error in any of them is the statement's error, raised as any other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Table

#: rows one inline UPDATE changes at most; more take one statement per slice
INLINE_SLICE = 512
#: a statement as the driver's text (placeholders of :func:`marker`) and its parameters
Statement = tuple[str, tuple[Any, ...]]


def marker(conn: Connection) -> str:
    """The driver's positional placeholder: ``%s`` (PyMySQL), ``?`` (sqlite3)."""
    return "?" if conn.dialect.paramstyle in ("qmark", "numeric") else "%s"


def rows(conn: Connection, sql: str, params: Iterable[Any]) -> Sequence[Any]:
    """The rows of ``sql`` (placeholders of :func:`marker`) with positional ``params``."""
    return conn.exec_driver_sql(sql, tuple(params)).all()


def integer(value: object) -> str:
    """``value`` as an SQL literal; anything but an ``int`` (a ``bool`` included) is refused,
    so that no text of a caller's can reach a statement."""
    if type(value) is not int:
        raise TypeError(f"not an integer: {value!r}")
    return repr(value)


def add_to_locked(
    conn: Connection, table: Table, changes: Sequence[tuple[int, tuple[int, int]]], now: datetime
) -> list[Statement]:
    """The UPDATEs that add its own ``(d_in_use, d_reserved)`` to each row of ``changes`` (id,
    deltas), rows this transaction has locked already: one per :data:`INLINE_SLICE` rows, its
    ids and deltas in its text."""
    stamp = sent(conn, table.c.updated_at)(now)
    statements: list[Statement] = []
    for start in range(0, len(changes), INLINE_SLICE):
        part = changes[start : start + INLINE_SLICE]
        ids = ",".join(integer(cid) for cid, _ in part)
        in_use = " ".join(f"WHEN {integer(cid)} THEN {integer(di)}" for cid, (di, _) in part)
        reserved = " ".join(f"WHEN {integer(cid)} THEN {integer(dr)}" for cid, (_, dr) in part)
        statements.append(
            (
                f"UPDATE {table.name} SET in_use = in_use + CASE id {in_use} ELSE 0 END,"  # noqa: S608
                f" reserved = reserved + CASE id {reserved} ELSE 0 END,"
                f" updated_at = {marker(conn)} WHERE id IN ({ids})",
                (stamp,),
            )
        )
    return statements


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> Statement:
    """One multi-row INSERT of ``rows`` (each with the same columns), each value as its
    column's type sends it."""
    names = tuple(rows[0])
    head, one, processors = _insert_of(conn, table, names)
    params = tuple(
        process(row[name]) for row in rows for process, name in zip(processors, names, strict=True)
    )
    return f"{head}{','.join([one] * len(rows))}", params


#: (dialect, table, columns) -> what :func:`insert_rows` writes of them, made once
_INSERTS: dict[tuple[type, str, str, tuple[str, ...]], tuple[str, str, list[Callable[[Any], Any]]]] = {}


def _insert_of(
    conn: Connection, table: Table, names: tuple[str, ...]
) -> tuple[str, str, list[Callable[[Any], Any]]]:
    """An INSERT's text up to its values, one row's placeholders, and each column's processor."""
    key = (type(conn.dialect), conn.dialect.paramstyle, table.name, names)
    if (found := _INSERTS.get(key)) is None:
        quote, m = conn.dialect.identifier_preparer.quote, marker(conn)
        columns = ",".join(quote(name) for name in names)
        found = (
            f"INSERT INTO {table.name} ({columns}) VALUES ",  # noqa: S608
            "(" + ",".join([m] * len(names)) + ")",
            [sent(conn, table.c[name]) for name in names],
        )
        _INSERTS[key] = found
    return found


def run(conn: Connection, statements: Sequence[Statement]) -> None:
    """Run ``statements`` in order: on MariaDB two or more as one compound statement (one
    round trip), elsewhere one after another."""
    if len(statements) > 1 and conn.dialect.name in ("mysql", "mariadb"):
        body = "".join(f"{sql}; " for sql, _ in statements)
        conn.exec_driver_sql(f"BEGIN NOT ATOMIC {body}END", tuple(p for _, ps in statements for p in ps))
        return
    for sql, params in statements:
        conn.exec_driver_sql(sql, params)


def write(conn: Connection, deferred: list[Statement] | None, statements: Sequence[Statement]) -> None:
    """Run ``statements`` now, or add them to ``deferred``: the writes of a transaction's
    ``writes_together`` block, run as one when it ends."""
    if deferred is not None:
        deferred.extend(statements)
    else:
        run(conn, statements)


def sent(conn: Connection, column: ColumnElement[Any]) -> Callable[[Any], Any]:
    """How ``column``'s type sends a value to the driver (SQLite's dates as text, ...)."""
    process = column.type._cached_bind_processor(conn.dialect)
    return process if process is not None else _as_is


def _as_is(value: Any) -> Any:
    return value
