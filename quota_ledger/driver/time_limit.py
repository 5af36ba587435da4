"""A caller's time limit on one transaction: how long it may wait for locks and statements.

A caller that must answer within a deadline (the admission webhook answers the API server
within its ``timeout``) gives :meth:`DbQuotaDriver.run` a ``timeout``. Each attempt then tells
the server what is left of it: a lock wait or a statement past it is interrupted, and the
driver gives up with :class:`DatabaseUnavailable` instead of waiting its whole retry budget.

On PostgreSQL the limits are transaction-local settings; on MariaDB session variables, set
back to the engine's defaults when the transaction ends. SQLite has no statement limit: its
writers queue in this process (:class:`FairLock`) and the time limit bounds the retries only.
"""

from __future__ import annotations

from sqlalchemy import Connection, exc, text

# bound on PostgreSQL: lock waits and statements of this transaction only (set_config(..., true)
# is SET LOCAL); no lock.
_PG_BOUND = text("SELECT set_config('lock_timeout', :ms, true), set_config('statement_timeout', :ms, true)")
# bound on MariaDB: the connection's statements (a lock wait included) end after :s seconds
# (fractions allowed) and a row lock wait after :whole; no lock.
_MY_BOUND = text("SET SESSION max_statement_time = :s, innodb_lock_wait_timeout = :whole")
# unbound on MariaDB: back to the engine's session defaults (dialect.build_engine); no lock.
_MY_UNBOUND = text("SET SESSION max_statement_time = 0, innodb_lock_wait_timeout = 20")

#: PostgreSQL: query_canceled (statement_timeout), lock_not_available (lock_timeout)
_PG_INTERRUPTED = {"57014", "55P03"}
#: MariaDB: ER_STATEMENT_TIMEOUT, ER_LOCK_WAIT_TIMEOUT; MySQL's ER_QUERY_TIMEOUT
_MY_INTERRUPTED = {1969, 1205, 3024}

#: the shortest limit a statement is given, in seconds: a server cannot act on less
SHORTEST = 0.05


def bound(conn: Connection, backend: str, seconds: float) -> None:
    """Limit the lock waits and statements of ``conn``'s transaction to ``seconds``."""
    seconds = max(SHORTEST, seconds)
    if backend == "postgresql":
        conn.execute(_PG_BOUND, {"ms": str(max(1, round(seconds * 1000)))})
    elif backend in ("mysql", "mariadb"):
        conn.execute(_MY_BOUND, {"s": round(seconds, 3), "whole": max(1, int(seconds))})


def unbound(conn: Connection, backend: str) -> None:
    """Undo :func:`bound` where it outlives the transaction (MariaDB's session)."""
    if backend in ("mysql", "mariadb") and not conn.invalidated and not conn.closed:
        conn.execute(_MY_UNBOUND)
        conn.commit()


def interrupted(error: exc.DBAPIError) -> bool:
    """Whether the server ended a statement because a limit of :func:`bound` was reached."""
    args = getattr(error.orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0] in _MY_INTERRUPTED
    return getattr(error.orig, "sqlstate", None) in _PG_INTERRUPTED
