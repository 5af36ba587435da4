"""Writer candidates in order of preference, replicas for reads, and the retry budget, on the
servers the tests were given, reached over TCP. A dead host is a closed loopback port, or a TCP
forwarder the test cuts.

A PostgreSQL that listens on a Unix socket only (the embedded server of a fresh machine) cannot
stand next to a dead TCP host in a list of URLs: its tests run on a PostgreSQL cluster of this
module's own instead, on a free loopback port (``tests/faults/pg_cluster.py``)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from tcp_proxy import TcpProxy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "faults"))  # pg_cluster

from pg_cluster import PgCluster

from quota_ledger import DatabaseUnavailable, OverQuota, QuotaEngine, UserNotFound
from quota_ledger.driver import topology
from quota_ledger.driver.topology import MariaDbNodes
from quota_ledger.driver.tx import LedgerTx


def _closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _at(url: URL, port: int) -> URL:
    return url.set(host="127.0.0.1", port=port)


def _scalar(sql: str) -> Callable[[LedgerTx], Any]:
    return lambda tx: tx.conn.execute(text(sql)).scalar()


def _database_name(url: URL) -> str:
    return "SELECT current_database()" if url.get_backend_name() == "postgresql" else "SELECT DATABASE()"


class Databases(Protocol):
    """Where a test makes more databases (replicas): tests/conftest.py's ``Server`` or
    :class:`OwnPostgres`."""

    def create_database(self) -> str: ...

    def url_for(self, database: str) -> URL: ...

    def drop_database(self, name: str) -> None: ...


class OwnPostgres:
    """A running :class:`PgCluster` with a migrated template; databases made as copies of it."""

    def __init__(self, cluster: PgCluster) -> None:
        self.cluster = cluster
        self.admin = create_engine(make_url(cluster.url_for("postgres")), isolation_level="AUTOCOMMIT")
        self.template = f"ql_template_{uuid.uuid4().hex[:8]}"
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.template}"'))
        with QuotaEngine.from_url(self.url_for(self.template)) as engine:
            engine.migrate()

    def create_database(self) -> str:
        name = f"ql_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
        return name

    def url_for(self, database: str) -> URL:
        return make_url(self.cluster.url_for(database))

    def drop_database(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[OwnPostgres]:
    """A PostgreSQL cluster of this module's own that listens on TCP (started only when asked for)."""
    cluster = PgCluster()
    try:
        cluster.start()
        own = OwnPostgres(cluster)
        yield own
        own.admin.dispose()
    finally:
        cluster.destroy()


@dataclass(frozen=True)
class Tcp:
    """A fresh, migrated database on a server reached over TCP, and that server."""

    url: URL
    server: Databases


def _over_tcp(url: URL, request: pytest.FixtureRequest) -> Iterator[Tcp]:
    """``url`` with its server when that listens on TCP, else a database on :func:`own_postgres`."""
    postgres = url.get_backend_name() == "postgresql"
    if url.host:
        yield Tcp(url, request.getfixturevalue("postgres_server" if postgres else "mariadb_server"))
        return
    own: OwnPostgres = request.getfixturevalue("own_postgres")
    name = own.create_database()
    try:
        yield Tcp(own.url_for(name), own)
    finally:
        own.drop_database(name)


@pytest.fixture
def tcp(server_db_url: URL, request: pytest.FixtureRequest) -> Iterator[Tcp]:
    """:func:`server_db_url` (PostgreSQL and MariaDB) over TCP."""
    yield from _over_tcp(server_db_url, request)


@pytest.fixture
def tcp_postgres(postgres_url: URL, request: pytest.FixtureRequest) -> Iterator[Tcp]:
    """:func:`postgres_url` over TCP."""
    yield from _over_tcp(postgres_url, request)


def test_a_dead_first_writer_is_passed_over(tcp: Tcp) -> None:
    urls = [_at(tcp.url, _closed_port()), tcp.url]
    with QuotaEngine.from_url(urls) as engine:
        engine.migrate()
        engine.set_limits("root.a", {"fpga": 10})
        made = engine.reserve("root.a", {"fpga": 2})
        assert engine.commit(made.id).committed == {"fpga": 2}
        assert engine.usage("root.a")["fpga"].in_use == 2
        # The refused host costs no retry: the connection attempt goes on to the next one.
        assert engine.driver.retries["disconnect"] == 0


def _tcp_options(fd: int) -> dict[str, int]:
    """The keepalive options of the TCP socket behind descriptor ``fd``, as the kernel holds them."""
    with socket.socket(fileno=os.dup(fd)) as sock:  # the same socket through a descriptor of its own
        return {
            "SO_KEEPALIVE": int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0),
            "keepalives_idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "keepalives_interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "keepalives_count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "tcp_user_timeout": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }


def test_server_connections_probe_a_silent_peer(tcp: Tcp) -> None:
    with QuotaEngine.from_url(tcp.url) as engine, engine.driver.engine.connect() as conn:
        raw: Any = conn.connection.driver_connection
        if tcp.url.get_backend_name() == "postgresql":
            given = raw.info.get_parameters()
            assert {name: given.get(name) for name in topology.KEEPALIVE} == {
                name: str(value) for name, value in topology.KEEPALIVE.items()
            }
            fd = raw.fileno()
        else:
            fd = raw._sock.fileno()  # PyMySQL's socket
        assert _tcp_options(fd) == {"SO_KEEPALIVE": 1, **topology.KEEPALIVE}


def test_a_libpq_multi_host_url_finds_the_primary(tcp_postgres: Tcp) -> None:
    postgres_url = tcp_postgres.url
    dead = _closed_port()
    url = (
        f"postgresql://{postgres_url.username}@/{postgres_url.database}"
        f"?host=127.0.0.1:{dead}&host={postgres_url.host}:{postgres_url.port or 5432}"
    )
    with QuotaEngine.from_url(url) as engine:
        assert engine.driver.url.query["target_session_attrs"] == "read-write"
        engine.migrate()
        engine.set_limits("root.a", {"fpga": 10})
        made = engine.reserve("root.a", {"fpga": 3})
        assert engine.commit(made.id).committed == {"fpga": 3}
        assert engine.driver.run(_scalar("SELECT inet_server_port()")) == (postgres_url.port or 5432)


def test_the_engine_carries_on_when_the_writer_dies_mid_traffic(tcp: Tcp) -> None:
    server_db_url = tcp.url
    proxy = TcpProxy((server_db_url.host or "127.0.0.1", server_db_url.port or _default_port(server_db_url)))
    proxy.start()
    engine = QuotaEngine.from_url([_at(server_db_url, proxy.port), server_db_url], pool_size=4)
    engine.set_limits("root.a", {"fpga": 1_000_000})
    done: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def client(name: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                made = engine.reserve("root.a", {"fpga": 1}, key=f"{name}-{n}")
                engine.commit(made.id)
            except BaseException as error:  # the test reports every failure
                errors.append(error)
                return
            done.append(time.monotonic())

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        _wait(lambda: len(done) >= 40 or bool(errors), 30)
        assert proxy.connections > 0, "the traffic goes through the first host"
        cut = time.monotonic()
        proxy.stop()
        _wait(lambda: sum(1 for at in done if at > cut) >= 40 or bool(errors), 30)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a caller hangs"
    assert errors == []
    first_after = min(at for at in done if at > cut)
    assert first_after - cut < 5, f"served again only {first_after - cut:.1f} s after the cut"
    assert engine.driver.retries["disconnect"] > 0
    assert engine.usage("root.a")["fpga"].in_use == len(done)
    assert engine.audit() == []
    if server_db_url.get_backend_name() != "postgresql":
        # MariaDB: the second node writes from now on, also once the first is back.
        nodes = _nodes(engine)
        assert nodes.current == 1
        proxy.start()
        engine.driver.engine.dispose()
        assert engine.driver.run(_scalar("SELECT 1")) == 1
        assert proxy.connections == 0
        proxy.stop()
    engine.close()


def test_read_only_work_goes_to_the_read_urls(tcp: Tcp) -> None:
    server_db_url, server = tcp.url, tcp.server
    replica = server.create_database()
    read_url = server.url_for(replica)
    name = _scalar(_database_name(server_db_url))
    try:
        read_urls = [_at(read_url, _closed_port()), read_url]
        with QuotaEngine.from_url(server_db_url, read_urls=read_urls) as engine:
            assert engine.driver.run(name, read_only=True) == replica
            assert engine.driver.run(name) == server_db_url.database
            assert engine.driver.read_engine is not None
            # A replica may be a standby: the read engine asks for no particular kind of host.
            assert "target_session_attrs" not in engine.driver.read_engine.url.query
        with QuotaEngine.from_url(server_db_url) as engine:
            assert engine.driver.run(name, read_only=True) == server_db_url.database
    finally:
        server.drop_database(replica)


def test_reports_read_the_replica_and_admission_the_writer(tcp: Tcp) -> None:
    # The "replica" is a database of its own with other limits, so the answers tell which one
    # each call read.
    server_db_url, server = tcp.url, tcp.server
    replica = server.create_database()
    read_url = server.url_for(replica)
    try:
        with QuotaEngine.from_url(read_url) as other:
            other.migrate()
            other.set_limits("root.a", {"fpga": 99})
        with QuotaEngine.from_url(server_db_url, read_urls=[read_url]) as engine:
            engine.migrate()
            engine.set_limits("root.a", {"fpga": 5})
            made = engine.reserve("root.a", {"fpga": 4}, user="alice", application="app-1")
            assert engine.get(made.id).id == made.id  # lookups stay on the writer
            with pytest.raises(OverQuota):
                engine.reserve("root.a", {"fpga": 2})  # admission reads the writer's limit
            assert engine.commit(made.id).committed == {"fpga": 4}
            assert engine.usage("root.a")["fpga"].limit == 99
            assert engine.limits() == {"root.a": {"fpga": 99}}
            with pytest.raises(UserNotFound):
                engine.user_usage("alice")  # the replica never saw her
            assert engine.config_version() == 1
    finally:
        server.drop_database(replica)


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
def test_an_unreachable_list_gives_up_within_retry_seconds(scheme: str) -> None:
    urls = [f"{scheme}://nobody@127.0.0.1:{_closed_port()}/none" for _ in range(2)]
    with QuotaEngine.from_url(urls, retry_attempts=1000, retry_seconds=1.5) as engine:
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match=r"attempts in 1\.5 s"):
            engine.usage("root.a")
        took = time.monotonic() - started
        # The last attempt starts on the deadline and waits at most CONNECT_TIMEOUT for each host.
        assert 1.5 <= took < 1.5 + 2 * topology.CONNECT_TIMEOUT, took
        # Retried, then stopped by the clock: waits of at least 0.1, 0.2, 0.4 and 0.8 s fill 1.5 s
        # after at most five attempts (fewer on a loaded machine), far from the 1000 allowed.
        assert 2 <= engine.driver.retries["disconnect"] <= 5


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
def test_an_unreachable_list_gives_up_after_retry_attempts(scheme: str) -> None:
    urls = [f"{scheme}://nobody@127.0.0.1:{_closed_port()}/none" for _ in range(2)]
    with QuotaEngine.from_url(urls, retry_attempts=3, retry_seconds=60) as engine:
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match="gave up after 3 attempts"):
            engine.reserve("root.a", {"fpga": 1})
        # Two waits of a disconnect: 0.1 to 0.2 s, then 0.2 to 0.4 s (longer only on a loaded
        # machine). The attempts stopped it, not the clock's 60 s (the message says which).
        assert time.monotonic() - started >= 0.3
        assert engine.driver.retries["disconnect"] == 3


def _nodes(engine: QuotaEngine) -> MariaDbNodes:
    nodes = topology.nodes(engine.driver.engine)
    assert nodes is not None
    return nodes


def _default_port(url: URL) -> int:
    return 5432 if url.get_backend_name() == "postgresql" else 3306


def _wait(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_cli_takes_writer_and_replica_lists(tcp: Tcp, capsys: pytest.CaptureFixture[str]) -> None:
    from quota_ledger.cli import main

    server_db_url = tcp.url

    def rendered(url: URL) -> str:
        return url.render_as_string(hide_password=False)

    writers = f"{rendered(_at(server_db_url, _closed_port()))} {rendered(server_db_url)}"
    common = ["--db", writers, "--read-db", rendered(server_db_url), "--json"]
    assert main([*common, "db", "upgrade"]) == 0
    assert main([*common, "limits", "set", "root.a", "fpga=4"]) == 0
    capsys.readouterr()
    assert main([*common, "limits", "show"]) == 0
    assert '"fpga": 4' in capsys.readouterr().out
