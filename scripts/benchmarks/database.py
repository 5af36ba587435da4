"""The servers under test: which URLs are accepted, the throw-away database each case runs on
(PostgreSQL, and MariaDB and SQLite for the cases that compare backends), and the few statements
the benchmark sends outside the ledger (VACUUM, versions)."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import create_engine, exc, text
from sqlalchemy.engine import URL, make_url

from benchmarks.harness import BenchError, log

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def local_url(text: str) -> URL:
    """The URL, with the psycopg driver, if it points at this machine; else refuse it."""
    url = make_url(text)
    if url.get_backend_name() != "postgresql":
        raise BenchError(f"the benchmark runs on PostgreSQL only, not {url.get_backend_name()!r}")
    host = url.host or str(url.query.get("host") or "")
    if host and host not in LOCAL_HOSTS and not host.startswith("/"):
        raise BenchError(f"refusing to benchmark a non-local server {host!r}: use 127.0.0.1 or a socket")
    return url.set(drivername="postgresql+psycopg")


def local_mariadb_url(text: str) -> URL:
    """A MariaDB URL, with the PyMySQL driver, if it points at this machine; else refuse it."""
    url = make_url(text)
    if url.get_backend_name() not in ("mysql", "mariadb"):
        raise BenchError(f"--mariadb takes a MariaDB URL, not {url.get_backend_name()!r}")
    if url.host and url.host not in LOCAL_HOSTS:
        raise BenchError(f"refusing to benchmark a non-local server {url.host!r}: use 127.0.0.1")
    return url.set(drivername="mysql+pymysql")


def libpq_params(url: URL) -> dict[str, Any]:
    """The URL as libpq keywords (for psycopg and for pgbench's flags)."""
    params: dict[str, Any] = {"dbname": url.database or "postgres"}
    host = url.host or url.query.get("host")
    if host:
        params["host"] = host
    if url.port:
        params["port"] = url.port
    if url.username:
        params["user"] = url.username
    if url.password:
        params["password"] = url.password
    return params


def conninfo(url: URL) -> str:
    """The URL as a libpq connection string."""
    return make_conninfo(**libpq_params(url))


@contextmanager
def fresh_database(server_url: URL) -> Iterator[URL]:
    """Create ``ql_bench_<random>`` on the server, yield its URL, drop it whatever happens."""
    name = f"ql_bench_{uuid.uuid4().hex[:10]}"
    admin = conninfo(server_url)
    try:
        admin_conn = psycopg.connect(admin, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError:
        admin = conninfo(server_url.set(database="postgres"))
        admin_conn = psycopg.connect(admin, autocommit=True, connect_timeout=10)
    with admin_conn:
        admin_conn.execute(f'CREATE DATABASE "{name}"')
        # A safety net so that no run can hang on a lock forever; never reached normally.
        admin_conn.execute(f"ALTER DATABASE \"{name}\" SET statement_timeout = '120s'")
    log(f"created database {name}")
    try:
        yield server_url.set(database=name)
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        log(f"dropped database {name}")


@contextmanager
def fresh_mariadb_database(server: str) -> Iterator[URL]:
    """Create ``ql_bench_<random>`` on the (local) MariaDB server, yield its URL, drop it
    whatever happens."""
    url = local_mariadb_url(server)
    name = f"ql_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        try:
            with admin.connect() as conn:
                conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
        except exc.DBAPIError as error:
            raise BenchError(
                f"cannot create a database on MariaDB at {url.host}:{url.port or 3306}: {error}"
            ) from error
        log(f"created MariaDB database {name}")
        try:
            yield url.set(database=name)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
            log(f"dropped MariaDB database {name}")
    finally:
        admin.dispose()


@contextmanager
def fresh_sqlite_database() -> Iterator[URL]:
    """A SQLite file in a temporary folder, removed at the end."""
    with tempfile.TemporaryDirectory() as folder:
        yield make_url(f"sqlite:///{Path(folder) / 'ledger.db'}")


def vacuum(dsn: str) -> None:
    """VACUUM ANALYZE between cells, as autovacuum would (test servers often run without it),
    so that no cell pays for the dead rows of the one before."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "VACUUM (ANALYZE) quota_usages, reservations, reservation_items, quota_journal,"
            " quota_identity_usages, quota_applications"
        )


def config_version(dsn: str) -> int:
    """The configuration version in force (the functions check the caller compiled it)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT version FROM quota_config_head WHERE id = 1").fetchone()
    if row is None:
        raise BenchError("no configuration head: is the database migrated?")
    return int(row[0])


def server_version(dsn: str) -> str:
    """``PostgreSQL <version>`` for the report's title."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return f"PostgreSQL {row[0].split()[0]}" if row else "PostgreSQL"
