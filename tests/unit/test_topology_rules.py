"""Engine topology without a server: which URL lists are accepted and what libpq is given, how
Galera's and a standby's errors are classified, and how the settings read several URLs."""

from __future__ import annotations

import struct

import psycopg
import pymysql.err
import pytest
from sqlalchemy import exc

from quota_ledger import InvalidRequest, QuotaEngine
from quota_ledger.driver import dialect, topology
from quota_ledger.runtime.settings import Settings


def _pymysql_error(errno: int, sqlstate: str, message: str) -> exc.DBAPIError:
    """The error pymysql raises for a server's error packet, wrapped as SQLAlchemy wraps it."""
    packet = b"\xff" + struct.pack("<H", errno) + b"#" + sqlstate.encode() + message.encode()
    try:
        pymysql.err.raise_mysql_exception(packet)
    except pymysql.err.Error as raised:
        return exc.DBAPIError.instance("SELECT 1", {}, raised, pymysql.err.Error)
    raise AssertionError("pymysql raised nothing")


def test_galera_not_ready_is_a_disconnect() -> None:
    error = _pymysql_error(1047, "08S01", "WSREP has not yet prepared node for application use")
    assert isinstance(error, exc.OperationalError)
    assert dialect.classify(error) == dialect.RETRY_DISCONNECT


@pytest.mark.parametrize(
    ("errno", "sqlstate", "message", "kind"),
    [
        # certification failure at commit and a brute-force abort both arrive as a deadlock
        (1213, "40001", "Deadlock found when trying to get lock; try restarting transaction", "conflict"),
        (1317, "70100", "Query execution was interrupted", "conflict"),
        (1180, "HY000", 'Got error 6 "No such device or address" during COMMIT', "disconnect"),
        (1927, "70100", "Connection was killed", "disconnect"),
        (1146, "42S02", "Table 'test.quota_reservations' doesn't exist", "schema"),
        (1064, "42000", "You have an error in your SQL syntax", "fatal"),
    ],
)
def test_mariadb_errors_are_classified(errno: int, sqlstate: str, message: str, kind: str) -> None:
    assert dialect.classify(_pymysql_error(errno, sqlstate, message)) == kind


def test_a_write_on_a_postgresql_standby_is_retried_like_a_lost_connection() -> None:
    orig = psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction")
    error = exc.DBAPIError.instance("UPDATE t SET a = 1", {}, orig, psycopg.Error)
    assert dialect.classify(error) == dialect.RETRY_DISCONNECT


def test_a_list_of_postgresql_urls_becomes_one_multi_host_url_for_a_primary() -> None:
    urls = topology.url_list(["postgresql://ql:pw@db1:5433/ledger", "postgresql://ql:pw@db2/ledger"])
    url = topology.postgres_url(urls, writer=True)
    assert url.drivername == "postgresql+psycopg"
    assert (url.host, url.port, url.username, url.database) == (None, None, "ql", "ledger")
    assert url.query["host"] == ("db1:5433", "db2:5432")
    assert url.query["target_session_attrs"] == "read-write"
    assert url.query["connect_timeout"] == str(topology.CONNECT_TIMEOUT)
    # Replicas: any host that answers.
    assert "target_session_attrs" not in topology.postgres_url(urls, writer=False).query


def test_a_libpq_multi_host_url_keeps_what_it_says() -> None:
    [given] = topology.url_list("postgresql://ql@/ledger?host=a:1&host=b:2&target_session_attrs=any")
    url = topology.postgres_url([given], writer=True)
    assert url.query["host"] == ("a:1", "b:2")
    assert url.query["target_session_attrs"] == "any"


def test_one_plain_postgresql_url_may_reach_any_kind_of_server() -> None:
    urls = topology.url_list("postgresql://ql@db1/ledger?connect_timeout=2")
    url = topology.postgres_url(urls, writer=True)
    assert url.host == "db1"
    assert "target_session_attrs" not in url.query
    assert url.query["connect_timeout"] == "2"


def test_postgresql_connections_are_kept_alive_unless_the_url_says_otherwise() -> None:
    [plain] = topology.url_list("postgresql://ql@db1/ledger")
    query = topology.postgres_url([plain], writer=True).query
    assert query["keepalives"] == "1"
    assert {name: query[name] for name in topology.KEEPALIVE} == {
        name: str(value) for name, value in topology.KEEPALIVE.items()
    }
    [own] = topology.url_list("postgresql://ql@db1/ledger?keepalives_idle=300&tcp_user_timeout=0")
    query = topology.postgres_url([own], writer=False).query
    assert (query["keepalives_idle"], query["tcp_user_timeout"]) == ("300", "0")
    assert query["keepalives_count"] == str(topology.KEEPALIVE["keepalives_count"])


@pytest.mark.parametrize(
    ("urls", "words"),
    [
        ([], "no database URL"),
        (["sqlite:///a.db", "sqlite:///b.db"], "SQLite takes one URL"),
        (["postgresql://ql@db1/ledger", "mysql://ql@db2/ledger"], "different databases"),
        (["postgresql://ql@db1/ledger", "postgresql://other@db2/ledger"], "host and port only"),
        (["postgresql://ql@db1/ledger", "postgresql://ql@db2/other"], "host and port only"),
        (["postgresql://ql@db1/ledger", "postgresql://ql@/ledger?host=a&host=b"], "one multi-host URL"),
        (["not a url"], "not a database URL"),
    ],
)
def test_url_lists_that_cannot_work_are_refused(urls: list[str], words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        QuotaEngine.from_url(urls)


def test_read_urls_must_name_the_writers_database() -> None:
    with pytest.raises(InvalidRequest, match="another database") as raised:
        QuotaEngine.from_url("postgresql://ql@db1/ledger", read_urls=["mysql://ql@db2/ledger"])
    assert raised.value.field == "read_db"


def test_settings_take_several_urls_separated_by_whitespace(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = "  mysql://ql@node1/ledger\n mysql://ql@node2/ledger\tmysql://ql@node3/ledger "
    monkeypatch.setenv("QUOTA_LEDGER_DB", nodes)
    monkeypatch.setenv("QUOTA_LEDGER_READ_DB", "postgresql://ql@replica/ledger")
    monkeypatch.setenv("QUOTA_LEDGER_RETRY_ATTEMPTS", "20")
    monkeypatch.setenv("QUOTA_LEDGER_RETRY_SECONDS", "30")
    settings = Settings()  # type: ignore[call-arg]
    assert settings.db_urls == [
        "mysql://ql@node1/ledger",
        "mysql://ql@node2/ledger",
        "mysql://ql@node3/ledger",
    ]
    options = settings.engine_options()
    assert options["read_urls"] == ["postgresql://ql@replica/ledger"]
    assert (options["retry_attempts"], options["retry_seconds"], options["galera_sync_wait"]) == (20, 30.0, 1)


def test_settings_without_read_urls_read_from_the_writer() -> None:
    settings = Settings(db="postgresql://ql@db1/ledger")  # type: ignore[call-arg]
    assert settings.db_urls == ["postgresql://ql@db1/ledger"]
    assert settings.engine_options()["read_urls"] is None
    assert (settings.retry_attempts, settings.retry_seconds) == (10, 15.0)


def test_a_sqlite_file_name_with_spaces_is_one_url() -> None:
    settings = Settings(db="sqlite:////home/Jo Doe/ledger.db")  # type: ignore[call-arg]
    assert settings.db_urls == ["sqlite:////home/Jo Doe/ledger.db"]
