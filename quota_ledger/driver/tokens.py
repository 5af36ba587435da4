"""Statements for the HTTP service's bearer tokens (``quota_tokens``); no locks beyond rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, select, update

from quota_ledger.driver.schema import quota_tokens

_T = quota_tokens.c
# find_token: the active token with this hash; no lock.
_FIND = select(_T.name, _T.token_hash, _T.role, _T.partition, _T.queue).where(
    _T.token_hash == bindparam("h"), _T.revoked_at.is_(None)
)
_LIST = select(_T.name, _T.role, _T.partition, _T.queue, _T.created_at, _T.revoked_at).order_by(_T.name)
_INSERT = insert(quota_tokens)
# delete_token: the row of this name, to replace it; locks that row.
_DELETE = delete(quota_tokens).where(_T.name == bindparam("n"))
_REVOKE = (
    update(quota_tokens)
    .where(_T.name == bindparam("n"), _T.revoked_at.is_(None))
    .values(revoked_at=bindparam("now"))
)


def find(conn: Connection, token_hash: str) -> Any:
    return conn.execute(_FIND, {"h": token_hash}).first()


def listing(conn: Connection) -> list[Any]:
    return list(conn.execute(_LIST))


def add(
    conn: Connection,
    *,
    name: str,
    token_hash: str,
    role: str,
    partition: str | None,
    queue: str | None,
    now: datetime,
) -> None:
    conn.execute(
        _INSERT,
        {
            "name": name,
            "token_hash": token_hash,
            "role": role,
            "partition": partition,
            "queue": queue,
            "created_at": now,
            "revoked_at": None,
        },
    )


def revoke(conn: Connection, name: str, now: datetime) -> bool:
    return conn.execute(_REVOKE, {"n": name, "now": now}).rowcount == 1


def remove(conn: Connection, name: str) -> None:
    conn.execute(_DELETE, {"n": name})
