"""Where the ledger's connections go: the writer candidates in order of preference, and replicas
for reads that tolerate bounded staleness.

- PostgreSQL: libpq connects to several hosts itself. A list of URLs that differ only in host
  and port becomes one multi-host URL (``?host=h1:p1&host=h2:p2``); a libpq multi-host URL may
  also be given directly. The writer's multi-host URL asks for ``target_session_attrs=read-write``
  (unless it says otherwise): a new connection goes to the first host that is a primary, so
  after a standby is promoted the engine finds it without a restart.
- MariaDB and Galera (pymysql knows one host): :class:`MariaDbNodes` opens every connection on
  the current node and moves to the next one that accepts when it fails. One node writes at a
  time, so Galera never has to certify two nodes' writes against each other. A Galera node that
  is not synced (``wsrep_ready`` OFF, or ``wsrep_local_state_comment`` other than ``Synced``,
  e.g. while it receives a state transfer) is skipped. It does not move back by itself.
- SQLite: one URL; a list is an :class:`InvalidRequest`.

Every TCP connection to a server probes a silent peer (:data:`KEEPALIVE`): a host that vanishes
without closing its connections (power loss, a network partition) fails the statement waiting on
it within about half a minute, as a lost connection, instead of after TCP's own timeouts (two
hours idle, a quarter of an hour with bytes unacknowledged). A PostgreSQL URL's own ``keepalives*``
or ``tcp_user_timeout`` win.

Connections to a node that died are discarded at once: every error that :func:`dialect.classify`
calls a disconnect (a Galera node that is not ready included) invalidates the connection and the
whole pool, so the next attempt opens a new
connection, which goes where the list says. This costs nothing while all is well, unlike
``pool_pre_ping``'s round trip before every transaction.
"""

from __future__ import annotations

import logging
import socket
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Engine, event, exc
from sqlalchemy.engine import URL, ExceptionContext

from quota_ledger.driver import dialect
from quota_ledger.model.errors import InvalidRequest

log = logging.getLogger("quota_ledger.driver")

#: one URL, or several: the candidates in order of preference
Urls = str | URL | Sequence[str | URL]

#: seconds a connection attempt waits for one host when its URL sets no ``connect_timeout``
CONNECT_TIMEOUT = 5

#: TCP keepalive of every server connection, by libpq's names: probes after ``keepalives_idle``
#: seconds of silence, then every ``keepalives_interval``; the connection fails once probes or a
#: statement's bytes go unacknowledged for ``tcp_user_timeout`` milliseconds
KEEPALIVE = {
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 20_000,
}

#: the socket options of :data:`KEEPALIVE` (``socket`` constants; those a platform lacks are left out)
_SOCKET_OPTIONS = (
    ("TCP_KEEPIDLE", KEEPALIVE["keepalives_idle"]),
    ("TCP_KEEPINTVL", KEEPALIVE["keepalives_interval"]),
    ("TCP_KEEPCNT", KEEPALIVE["keepalives_count"]),
    ("TCP_USER_TIMEOUT", KEEPALIVE["tcp_user_timeout"]),
)

#: ``wsrep_sync_wait`` of the writer's sessions on Galera: reads wait for the cluster
GALERA_SYNC_WAIT = 1

_nodes: weakref.WeakKeyDictionary[Engine, MariaDbNodes] = weakref.WeakKeyDictionary()


def url_list(urls: Urls, *, field: str = "db") -> list[URL]:
    """The URLs of ``urls`` (one URL or a sequence), normalized; a bad list is an
    :class:`InvalidRequest` on ``field``."""
    items: list[str | URL] = [urls] if isinstance(urls, str | URL) else list(urls)
    if not items:
        raise InvalidRequest("no database URL given", field=field)
    parsed = [dialect.normalize_url(dialect.parse_url(item)) for item in items]
    backends = sorted({url.get_backend_name() for url in parsed})
    if len(backends) > 1:
        raise InvalidRequest(f"the URLs name different databases: {', '.join(backends)}", field=field)
    if backends == ["sqlite"] and len(parsed) > 1:
        raise InvalidRequest("SQLite takes one URL, not a list", field=field)
    return parsed


def writer_engine(
    urls: Sequence[URL], *, pool_size: int, echo: bool, galera_sync_wait: int = GALERA_SYNC_WAIT
) -> Engine:
    """The engine every transaction that may write runs on.

    On Galera its sessions set ``wsrep_sync_wait = galera_sync_wait`` (0: leave the server's
    setting). The default, 1, makes every ``SELECT`` (``FOR UPDATE`` too) first wait until this
    node has applied every write set the cluster committed before it: a read that decides
    admission or looks a reservation up sees the latest committed write, also just after a
    failover to a node that was still applying its predecessor's last commits. The cost is one
    causality round trip through the group per read statement (well under a millisecond on one
    LAN, a WAN round trip across sites) plus any apply lag; a single writer has no lag of its own
    to wait for. 3 also covers ``UPDATE``/``DELETE``, 7 ``INSERT`` too: the ledger's writes
    follow a locking read, so 1 is enough.
    """
    return _engine(urls, writer=True, pool_size=pool_size, echo=echo, sync_wait=galera_sync_wait)


def read_engine(urls: Sequence[URL], *, pool_size: int, echo: bool) -> Engine:
    """The engine of read-only work that tolerates bounded staleness: replicas, tried in order.
    Its sessions leave ``wsrep_sync_wait`` alone and ask libpq for no particular kind of host."""
    return _engine(urls, writer=False, pool_size=pool_size, echo=echo, sync_wait=0)


def _engine(urls: Sequence[URL], *, writer: bool, pool_size: int, echo: bool, sync_wait: int) -> Engine:
    first = urls[0]
    backend = first.get_backend_name()
    if backend == "sqlite":
        return dialect.build_engine(first, echo=echo)
    if backend == "postgresql":
        engine = dialect.build_engine(postgres_url(urls, writer=writer), pool_size=pool_size, echo=echo)
    elif backend in ("mysql", "mariadb"):
        nodes = MariaDbNodes(urls, sync_wait=sync_wait)
        engine = dialect.build_engine(first, pool_size=pool_size, echo=echo, creator=nodes.connect)
        nodes.bind(engine)
        _nodes[engine] = nodes
    else:
        return dialect.build_engine(first, pool_size=pool_size, echo=echo)  # raises: unsupported
    event.listen(engine, "handle_error", _invalidate_on_disconnect)
    return engine


def nodes(engine: Engine) -> MariaDbNodes | None:
    """The nodes an engine on MariaDB opens its connections on (None on other databases)."""
    return _nodes.get(engine)


def _invalidate_on_disconnect(context: ExceptionContext) -> None:
    # SQLAlchemy recognizes lost connections by itself; a Galera node that answers "not ready" it
    # does not: the connection works but must not be used again.
    error = context.sqlalchemy_exception
    if (
        not context.is_disconnect
        and isinstance(error, exc.DBAPIError)
        and dialect.classify(error) == dialect.RETRY_DISCONNECT
    ):
        context.is_disconnect = True


def postgres_url(urls: Sequence[URL], *, writer: bool) -> URL:
    """One libpq URL for ``urls``: several plain URLs become one multi-host URL, which a writer
    asks to be a primary; every host waits :data:`CONNECT_TIMEOUT` seconds and keeps its
    connections alive (:data:`KEEPALIVE`) unless it says otherwise."""
    first = urls[0]
    url = first if len(urls) == 1 else _merge_hosts(urls)
    query = dict(url.query)
    hosts = query.get("host")
    several = len(hosts) > 1 if isinstance(hosts, tuple) else "," in (hosts or "")
    if writer and several:
        query.setdefault("target_session_attrs", "read-write")
    query.setdefault("connect_timeout", str(CONNECT_TIMEOUT))
    query.setdefault("keepalives", "1")
    for name, value in KEEPALIVE.items():
        query.setdefault(name, str(value))
    return url.set(query=query)


def _merge_hosts(urls: Sequence[URL]) -> URL:
    first = urls[0]
    same = (first.drivername, first.username, first.password, first.database, dict(first.query))
    hosts: list[str] = []
    for url in urls:
        if "host" in url.query or not url.host:
            raise InvalidRequest(
                "a list of PostgreSQL URLs names one host each; for more, pass one multi-host URL",
                field="db",
            )
        if (url.drivername, url.username, url.password, url.database, dict(url.query)) != same:
            raise InvalidRequest("the PostgreSQL URLs of a list may differ in host and port only", field="db")
        hosts.append(f"{url.host}:{url.port or 5432}")
    return URL.create(
        first.drivername,
        username=first.username,
        password=first.password,
        database=first.database,
        query={**first.query, "host": tuple(hosts)},
    )


class MariaDbNodes:
    """Opens the connections of an engine on MariaDB or Galera nodes, one node at a time.

    Every new connection goes to the current node (at first the first one). When it cannot be
    reached, or is a Galera node that is not synced, the next node in the list that accepts and
    is ready becomes the current one (after the last comes the first). A pooled connection to a
    node that is no longer the current one is discarded at checkout, so one node serves all
    writes. On Galera (``wsrep_on`` = ON) each session sets ``wsrep_sync_wait`` (see
    :func:`writer_engine`) unless ``sync_wait`` is 0.
    """

    def __init__(self, urls: Sequence[URL], *, sync_wait: int) -> None:
        self.urls = list(urls)
        self.sync_wait = sync_wait
        #: index in :attr:`urls` of the node new connections go to
        self.current = 0
        self._params: list[tuple[list[Any], dict[str, Any]]] = []
        self._connect: Callable[..., Any] | None = None
        self._errors: type[Exception] = Exception
        self._not_ready: type[Exception] = Exception
        self._lock = threading.Lock()

    def bind(self, engine: Engine) -> None:
        """Take the driver and its connection arguments from ``engine`` (made with
        :meth:`connect` as its creator), and check the node of every pooled connection."""
        dbapi = engine.dialect.loaded_dbapi
        self._connect = dbapi.connect
        self._errors = dbapi.Error
        self._not_ready = dbapi.OperationalError
        for url in self.urls:
            args, params = engine.dialect.create_connect_args(url)
            params.setdefault("connect_timeout", CONNECT_TIMEOUT)
            self._params.append((list(args), dict(params)))
        if len(self.urls) > 1:
            event.listen(engine, "checkout", self._check_node)

    def address(self, index: int) -> tuple[str, int]:
        params = self._params[index][1]
        return str(params.get("host", "localhost")), int(params.get("port", 3306))

    def connect(self) -> Any:
        """A DB-API connection to the current node, or to the next one that is ready."""
        with self._lock:
            start = self.current
        last: Exception | None = None
        for step in range(len(self.urls)):
            index = (start + step) % len(self.urls)
            try:
                conn = self._open(index)
            except self._errors as error:
                last = error
                continue
            with self._lock:
                if self.current != index:
                    log.warning("database node %s:%s takes over", *self.address(index))
                    self.current = index
            return conn
        assert last is not None
        raise last

    def _open(self, index: int) -> Any:
        assert self._connect is not None, "bind() first"
        args, params = self._params[index]
        conn = self._connect(*args, **params)
        try:
            keep_alive(conn)
            with conn.cursor() as cur:
                cur.execute("SHOW VARIABLES LIKE 'wsrep_on'")
                row = cur.fetchone()
                if row is None or str(row[1]).upper() != "ON":
                    return conn
                cur.execute(
                    "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_local_state_comment')"
                )
                status = {str(name).lower(): str(value) for name, value in cur.fetchall()}
                ready = status.get("wsrep_ready", "").upper() == "ON"
                state = status.get("wsrep_local_state_comment", "")
                if not ready or state != "Synced":
                    host, port = self.address(index)
                    raise self._not_ready(
                        1047, f"Galera node {host}:{port} is not ready: wsrep_ready={ready}, state {state!r}"
                    )
                if self.sync_wait:
                    cur.execute("SET SESSION wsrep_sync_wait = %s", (int(self.sync_wait),))
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_node(self, dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        with self._lock:
            current = self.address(self.current)
        if (str(dbapi_conn.host), int(dbapi_conn.port)) != current:
            # The pool opens a new connection, on the current node, in its place.
            raise exc.DisconnectionError("pooled connection to a node that no longer writes")


def keep_alive(conn: Any) -> None:
    """Set :data:`KEEPALIVE` on a PyMySQL connection's TCP socket (a Unix socket needs none)."""
    sock = getattr(conn, "_sock", None)  # PyMySQL's socket: it has no public accessor
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _SOCKET_OPTIONS:
        if (option := getattr(socket, name, None)) is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
