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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table

#: rows one inline UPDATE changes at most; more take one statement per slice
INLINE_SLICE = 512


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
) -> None:
    """Add its own ``(d_in_use, d_reserved)`` to each row of ``changes`` (id, deltas), rows this
    transaction has locked already: one UPDATE per :data:`INLINE_SLICE` rows, its ids and
    deltas in its text."""
    process = table.c.updated_at.type._cached_bind_processor(conn.dialect)
    stamp = process(now) if process is not None else now
    for start in range(0, len(changes), INLINE_SLICE):
        part = changes[start : start + INLINE_SLICE]
        ids = ",".join(integer(cid) for cid, _ in part)
        in_use = " ".join(f"WHEN {integer(cid)} THEN {integer(di)}" for cid, (di, _) in part)
        reserved = " ".join(f"WHEN {integer(cid)} THEN {integer(dr)}" for cid, (_, dr) in part)
        conn.exec_driver_sql(
            f"UPDATE {table.name} SET in_use = in_use + CASE id {in_use} ELSE 0 END,"  # noqa: S608
            f" reserved = reserved + CASE id {reserved} ELSE 0 END,"
            f" updated_at = {marker(conn)} WHERE id IN ({ids})",
            (stamp,),
        )
