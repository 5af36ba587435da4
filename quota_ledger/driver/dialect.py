"""Everything that differs between PostgreSQL, MariaDB/MySQL and SQLite, in one place."""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Engine, Integer, create_engine, event, exc, insert
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.pool import PoolResetState
from sqlalchemy.sql import ClauseElement, Insert
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.schema import Table

from quota_ledger.model import url_text
from quota_ledger.model.errors import InvalidRequest

# First key of PostgreSQL's two-int advisory locks, so ours never collide with an application's.
ADVISORY_NAMESPACE = 0x51_4C_44  # "QLD"


class utcnow(FunctionElement[Any]):  # noqa: N801 - reads like a SQL function
    """The database server's clock as naive UTC, read when the statement runs."""

    type = DateTime()
    inherit_cache = True


def aware(value: datetime) -> datetime:
    """A timestamp as read from a column (naive UTC on every backend), as UTC."""
    return value.replace(tzinfo=UTC)


def naive(value: datetime) -> datetime:
    """A timestamp as a column stores it: naive UTC."""
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value


@compiles(utcnow, "postgresql")
def _pg_utcnow(element: ClauseElement, compiler: SQLCompiler, **kw: Any) -> str:
    return "TIMEZONE('UTC', clock_timestamp())"


@compiles(utcnow, "mysql")
@compiles(utcnow, "mariadb")
def _my_utcnow(element: ClauseElement, compiler: SQLCompiler, **kw: Any) -> str:
    return "UTC_TIMESTAMP(6)"


@compiles(utcnow, "sqlite")
def _lite_utcnow(element: ClauseElement, compiler: SQLCompiler, **kw: Any) -> str:
    # SQLAlchemy stores SQLite datetimes as 'YYYY-MM-DD HH:MM:SS.ffffff'; %f gives SS.mmm.
    return "strftime('%Y-%m-%d %H:%M:%f000', 'now')"


class time_bucket(FunctionElement[Any]):  # noqa: N801 - reads like a SQL function
    """``FLOOR((timestamp - since) / step_seconds)`` as an integer: which step a time falls in.

    Arguments: a timestamp column, the start of the first step and the step in seconds (both
    bound parameters); the history reads group journal and reservation rows by it.
    """

    type = Integer()
    inherit_cache = True


def _bucket_args(element: FunctionElement[Any], compiler: SQLCompiler, **kw: Any) -> list[str]:
    return [compiler.process(clause, **kw) for clause in element.clauses]


@compiles(time_bucket, "postgresql")
def _pg_bucket(element: FunctionElement[Any], compiler: SQLCompiler, **kw: Any) -> str:
    at, since, step = _bucket_args(element, compiler, **kw)
    return f"CAST(FLOOR(EXTRACT(EPOCH FROM ({at} - {since})) / {step}) AS INTEGER)"


@compiles(time_bucket, "mysql")
@compiles(time_bucket, "mariadb")
def _my_bucket(element: FunctionElement[Any], compiler: SQLCompiler, **kw: Any) -> str:
    at, since, step = _bucket_args(element, compiler, **kw)
    return f"FLOOR(TIMESTAMPDIFF(MICROSECOND, {since}, {at}) / ({step} * 1000000))"


@compiles(time_bucket, "sqlite")
def _lite_bucket(element: FunctionElement[Any], compiler: SQLCompiler, **kw: Any) -> str:
    # julianday() is a double: about 50 microseconds of precision today, plenty for steps of
    # seconds. The WHERE clause keeps times at or after ``since``, so CAST truncation is FLOOR.
    at, since, step = _bucket_args(element, compiler, **kw)
    return f"CAST((julianday({at}) - julianday({since})) * 86400.0 / {step} AS INTEGER)"


def parse_url(url: str | URL) -> URL:
    """The URL parsed; a text that is not one is an :class:`InvalidRequest` on ``db``, which
    shows the text without its password."""
    if isinstance(url, str) and not url.lower().startswith("sqlite") and len(url.strip().split()) > 1:
        raise InvalidRequest(
            f"not a database URL: {url_text.redact(url.strip())} (a space in a URL is written %20; "
            "several URLs are separated by spaces, each starting with its scheme)",
            field="db",
        )
    try:
        parsed = make_url(url)
        if parsed.host and "@" in parsed.host:  # the rest of a password with an @ in it
            raise exc.ArgumentError("an @ in the host")
        return parsed
    except (exc.ArgumentError, ValueError) as error:  # ValueError: a port that is no number
        shown = url_text.redact(url) if isinstance(url, str) else repr(url)
        message = f"not a database URL: {shown}"
        if isinstance(error, ValueError):
            message += " (its port is not a number, or its password holds a character to %-escape)"
        elif isinstance(url, str) and "://" in url:
            message += " (a password's @, /, ?, : or space is written %40, %2F, %3F, %3A, %20)"
        elif isinstance(url, str) and "://" not in url and url.strip():
            # A file name: the URL of a SQLite file has three slashes before a relative path.
            message += f"; the SQLite file {shown} is sqlite:///{shown}"
            if not url.startswith("/"):
                message += " (an absolute path has a fourth slash: sqlite:////path/to/file.db)"
        # Not chained: the parser's own message quotes the part it could not read, which may be
        # (a piece of) the password.
        raise InvalidRequest(message, field="db") from None


def normalize_url(url: str | URL) -> URL:
    """Pick the drivers this package installs when a URL names none."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.drivername in ("mysql", "mariadb"):
        parsed = parsed.set(drivername=f"{parsed.drivername}+pymysql")
    return parsed


def build_engine(
    url: str | URL,
    *,
    pool_size: int = 10,
    max_overflow: int = 30,
    echo: bool = False,
    creator: Callable[[], Any] | None = None,
) -> Engine:
    """A SQLAlchemy engine set up the way the driver's locking assumes; ``creator`` (server
    databases only) opens its connections instead of the driver's ``connect`` on ``url``."""
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql", "mysql", "mariadb"):
        raise InvalidRequest(
            f"unsupported database {backend!r}: use postgresql, mysql/mariadb or sqlite", field="db"
        )
    try:  # the dialect and its DBAPI module, which create_engine would fail to load
        parsed.get_dialect().import_dbapi()
    except (exc.NoSuchModuleError, ImportError) as error:
        raise InvalidRequest(f"no database driver {parsed.drivername!r}: {error}", field="db") from error
    if backend == "sqlite":
        return _sqlite_engine(parsed, echo=echo)
    options: dict[str, Any] = {
        "pool_size": pool_size,
        "max_overflow": max_overflow,
        "pool_recycle": 3600,
        # The connection returned last is handed out first: after a burst, a lone caller keeps
        # reusing one warm server process instead of cycling through every pooled one (one
        # thread on one queue after a 16-thread burst: 214 -> 335 pairs/s, where raw psycopg on
        # one connection did 329-404), and the others can idle out.
        "pool_use_lifo": True,
        "echo": echo,
        # Row locks are read fresh under READ COMMITTED; nothing relies on snapshots.
        "isolation_level": "READ COMMITTED",
    }
    if creator is not None:
        options["creator"] = creator
    if backend == "postgresql":
        return create_engine(parsed, **options)
    # MySQL or MariaDB. The pool's reset is _reset_if_in_transaction: PyMySQL sends a ROLLBACK on
    # every rollback(), also after a commit, where it is one more round trip per call for nothing.
    engine = create_engine(parsed, **options, pool_reset_on_return=None)

    @event.listens_for(engine, "connect")
    def _session_setup(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute("SET SESSION innodb_lock_wait_timeout = 20")

    event.listen(engine, "reset", _reset_if_in_transaction)
    return engine


#: SERVER_STATUS_IN_TRANS of the MySQL protocol's status flags
_MY_IN_TRANSACTION = 0x0001


def _reset_if_in_transaction(dbapi_conn: Any, _record: Any, state: PoolResetState) -> None:
    """A MariaDB/MySQL connection going back to the pool is rolled back unless the server said,
    in its last reply, that no transaction is open (a commit's reply says so): what psycopg and
    sqlite3 do by themselves. A driver that does not tell is always rolled back."""
    if state.transaction_was_reset or not state.asyncio_safe:
        return
    status = getattr(dbapi_conn, "server_status", None)
    if not isinstance(status, int) or status & _MY_IN_TRANSACTION:
        dbapi_conn.rollback()


def _sqlite_engine(url: URL, *, echo: bool) -> Engine:
    engine = create_engine(url, echo=echo, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite would defer it).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if url.database not in (None, "", ":memory:"):
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # Take the write lock up front: concurrent writers queue on busy_timeout instead of
        # failing halfway with SQLITE_BUSY on lock upgrade, across processes too.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def advisory_key(partition: str) -> int:
    """A stable signed 32-bit key for a partition's advisory lock."""
    value = zlib.crc32(partition.encode())
    return value - 2**32 if value >= 2**31 else value


def insert_ignoring_duplicates(backend: str, table: Table) -> Insert:
    """``INSERT`` that silently skips rows whose unique key already exists."""
    if backend == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if backend == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    if backend in ("mysql", "mariadb"):
        # Not INSERT IGNORE: that would also turn CHECK violations into warnings. The key is
        # set to itself: ``VALUES(id)`` would be a new auto-increment value, moving the row to
        # a new id, and a locking read waiting on the row meanwhile can then miss it.
        first = next(iter(table.primary_key.columns))
        return mysql.insert(table).on_duplicate_key_update({first.name: first})
    return insert(table)


# What a failure means, decided once here: retry it, or tell the caller.
RETRY_CONFLICT = "conflict"  # deadlock, serialization failure, lock timeout, busy
RETRY_DISCONNECT = "disconnect"  # connection lost; the transaction may or may not have committed
RETRY_DUPLICATE = "duplicate"  # a concurrent insert of the same unique key won
MISSING_SCHEMA = "schema"
FATAL = "fatal"

_PG_CONFLICT = {"40P01", "40001", "55P03"}
_PG_DISCONNECT_PREFIXES = ("08", "57P")
# read_only_sql_transaction: a write reached a standby (a host that is not, or no longer, the
# primary). Like a lost connection: drop it and connect again, which finds the primary once
# there is one (a libpq multi-host URL tries its hosts in order).
_PG_READ_ONLY = "25006"
# Galera reports a certification failure and a brute-force abort (a replicated write set
# that won against a local transaction) as 1213, a deadlock; a statement interrupted by the
# abort may see 1317 instead.
_MY_CONFLICT = {1205, 1213, 1020, 1317}
_MY_DISCONNECT = {
    1047,  # ER_UNKNOWN_COM_ERROR (08S01): "WSREP has not yet prepared node for application use"
    1053,  # ER_SERVER_SHUTDOWN
    1158,  # ER_NET_READ_ERROR
    1159,  # ER_NET_READ_INTERRUPTED
    1160,  # ER_NET_ERROR_ON_WRITE
    1161,  # ER_NET_WRITE_INTERRUPTED
    1180,  # ER_ERROR_DURING_COMMIT: a Galera node that left the primary component mid-commit
    1927,  # ER_CONNECTION_KILLED
    2002,  # CR_CONNECTION_ERROR
    2003,  # CR_CONN_HOST_ERROR
    2006,  # CR_SERVER_GONE_ERROR
    2013,  # CR_SERVER_LOST
    2014,  # CR_COMMANDS_OUT_OF_SYNC
    2055,  # CR_SERVER_LOST_EXTENDED
    4031,  # ER_CLIENT_INTERACTION_TIMEOUT
}


def classify(error: exc.DBAPIError) -> str:
    """Sort a driver error into one of the retry classes above.

    A disconnect means the connection must not be used again: besides a lost connection, a
    Galera node that is not ready (1047, while it rejoins or outside the primary component); the
    next attempt may reach another node. So is a write on a PostgreSQL standby (25006): a
    writer that reached the standby while the primary was down (a multi-host URL without
    ``target_session_attrs=read-write``, a name or address that moves to the new primary) finds
    it promoted, or the primary, on a later attempt; a writer URL that only ever names a standby
    spends the retry budget and gets :class:`DatabaseUnavailable`.
    """
    orig = error.orig
    if error.connection_invalidated:
        return RETRY_DISCONNECT
    args = getattr(orig, "args", ())
    code = args[0] if args and isinstance(args[0], int) else None
    if code is not None:  # pymysql: an errno (its sqlstate would be ambiguous, e.g. HY000)
        if code in _MY_CONFLICT:
            return RETRY_CONFLICT
        if code in _MY_DISCONNECT:
            return RETRY_DISCONNECT
        if code == 1062:
            return RETRY_DUPLICATE
        if code in (1146, 1054):
            return MISSING_SCHEMA
        return FATAL
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is None and type(orig).__module__.startswith("psycopg"):
        # psycopg reports client-side and connection failures without an SQLSTATE (a backend
        # killed mid-pipeline surfaces as "cannot exit pipeline mode while busy").
        return RETRY_DISCONNECT if isinstance(error, exc.OperationalError) else FATAL
    if sqlstate is not None:  # psycopg
        if sqlstate in _PG_CONFLICT:
            return RETRY_CONFLICT
        if sqlstate.startswith(_PG_DISCONNECT_PREFIXES) or sqlstate == _PG_READ_ONLY:
            return RETRY_DISCONNECT
        if sqlstate == "23505":
            return RETRY_DUPLICATE
        if sqlstate in ("42P01", "42703"):
            return MISSING_SCHEMA
        return FATAL
    text = str(orig).lower()
    if "database is locked" in text or "database is busy" in text:
        return RETRY_CONFLICT
    if "unique constraint failed" in text:
        return RETRY_DUPLICATE
    if "no such table" in text or "no such column" in text:
        return MISSING_SCHEMA
    # psycopg reports a dropped connection without an SQLSTATE.
    if isinstance(error, exc.OperationalError) and any(
        word in text for word in ("closed", "terminat", "connection")
    ):
        return RETRY_DISCONNECT
    return FATAL


# A connection that could not be opened, sorted by what would fix it. Only the text says which
# on psycopg: a failed connection carries no SQLSTATE.
REFUSED = "refused"  # nothing listens there (yet): a server that is down or restarting
AUTHENTICATION = "authentication"  # wrong user or password: retrying cannot fix it
UNKNOWN_DATABASE = "unknown_database"  # the server has no such database: nor this
UNKNOWN_HOST = "unknown_host"  # the name does not resolve
UNREACHABLE = "unreachable"  # a timeout, no route, a reset: anything else before a session
#: connection failures that no retry can fix
PERMANENT = frozenset({AUTHENTICATION, UNKNOWN_DATABASE})

_MY_AUTHENTICATION = {1044, 1045, 1698}  # access denied to the database / for the user
_MY_UNKNOWN_DATABASE = 1049
_MY_CANNOT_CONNECT = {2002, 2003}  # CR_CONNECTION_ERROR, CR_CONN_HOST_ERROR
_MY_UNKNOWN_HOST = 2005
# libpq's and the server's words; "the database system is starting up" must stay transient
_PG_WORDS = (
    (re.compile(r"authentication failed|no pg_hba\.conf entry|^role \".*\" does not exist"), AUTHENTICATION),
    (re.compile(r"^database \".*\" does not exist"), UNKNOWN_DATABASE),
    (re.compile(r"connection refused"), REFUSED),
    (re.compile(r"failed to resolve host|could not translate host name"), UNKNOWN_HOST),
)


def connect_failure(error: exc.DBAPIError) -> tuple[str, str] | None:
    """``(kind, reason)`` when ``error`` is a connection that could not be opened: the kind
    above, and the driver's reason in its own words (``connection refused``, ``password
    authentication failed for user "app"``, ``Unknown database 'x'``), which never holds a
    password. None for any other error."""
    orig = error.orig
    text = str(orig).strip()
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    code = args[0] if args and isinstance(args[0], int) else None
    if code is not None:  # pymysql: (errno, message)
        message = str(args[1]) if len(args) > 1 else text
        if code in _MY_AUTHENTICATION:
            return AUTHENTICATION, message
        if code == _MY_UNKNOWN_DATABASE:
            return UNKNOWN_DATABASE, message
        if code == _MY_UNKNOWN_HOST:
            return UNKNOWN_HOST, message
        if code in _MY_CANNOT_CONNECT:
            if "refused" in message.lower():
                return REFUSED, "connection refused"
            return UNREACHABLE, message
        return None
    if not type(orig).__module__.startswith("psycopg") or getattr(orig, "sqlstate", None) is not None:
        return None
    if not text.startswith(("connection failed", "connection is bad", "failed to resolve host")):
        return None
    # "connection failed: connection to server at "h", port 1 failed: FATAL:  <reason>": the
    # last host's reason (a multi-host URL names each in turn).
    first = text.splitlines()[0]
    reason = first.rsplit("failed: ", 1)[-1].removeprefix("FATAL:").strip()
    lowered = reason.lower()
    if "connection refused" in lowered:
        reason = "connection refused"
    for words, kind in _PG_WORDS:
        if words.search(lowered):
            return kind, reason
    return UNREACHABLE, reason


def where(url: URL) -> str:
    """``user@host:port/database`` of ``url`` for a message: never its password."""
    if url.get_backend_name() == "sqlite":
        return url.database or "memory"
    hosts = url.query.get("host") if url.host is None else None
    if isinstance(hosts, tuple):
        hosts = ",".join(hosts)
    host = url.host or hosts or "localhost"
    port = f":{url.port}" if url.port else ""
    user = f"{url.username}@" if url.username else ""
    return f"{user}{host}{port}/{url.database or ''}"
