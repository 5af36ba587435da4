"""A three-node MariaDB Galera cluster of the tests' own, on loopback ports, that they may kill.

It runs the installed ``mariadbd`` (``QUOTA_LEDGER_MARIADBD`` overrides it) with Debian's galera-4
provider (``/usr/lib/galera/libgalera_smm.so``, or ``QUOTA_LEDGER_GALERA_PROVIDER``). Every node
has its own directory under one root: a ``my.cnf`` passed as ``--defaults-file``, a data
directory, a socket, an error log, and four free loopback ports (SQL, group communication, IST
and the rsync SST daemon). Node 1 is made with ``mariadb-install-db`` and bootstraps the cluster
(``--wsrep-new-cluster``); the others start empty and receive a full state transfer (SST, rsync)
from it. A node killed with ``kill -9`` and started again rejoins with an incremental transfer
(IST) from another node's cache. The machine's own MariaDB (port 3306 and its data directory) is
never touched. Run as root, the servers run as the ``mysql`` user in directories it owns (as root,
the rsync daemon of a state transfer would drop to ``nobody`` and could not write the data).

Anything that keeps the cluster from starting raises :class:`ClusterError`: the tests fail
loudly instead of skipping (but see the ``galera`` fixture for a machine with no MariaDB).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pymysql
from pg_cluster import ClusterError, free_port

MARIADBD = Path(os.environ.get("QUOTA_LEDGER_MARIADBD", "/usr/sbin/mariadbd"))
PROVIDER = Path(os.environ.get("QUOTA_LEDGER_GALERA_PROVIDER", "/usr/lib/galera/libgalera_smm.so"))
INSTALL_DB = "mariadb-install-db"
STATE_FILE = "cluster.json"
#: who the servers run as when started by root
SERVER_USER = "mysql"

# A throw-away node: process crashes are injected, not power loss, so commits reach the OS page
# cache only (innodb_flush_log_at_trx_commit = 2). Failure detection is quicker than Galera's
# defaults (suspect after 5 s, evict after 15 s), so a killed node leaves the group in seconds.
_CNF = """\
[mariadbd]
{user}
datadir = {data}
socket = {socket}
pid-file = {pid}
log-error = {log}
port = {port}
bind-address = 127.0.0.1
skip-name-resolve = OFF
max_connections = 200
innodb_buffer_pool_size = 64M
innodb_log_file_size = 32M
innodb_flush_log_at_trx_commit = 2
innodb_doublewrite = 0
innodb_autoinc_lock_mode = 2
binlog_format = ROW
default_storage_engine = InnoDB
character_set_server = utf8mb4
collation_server = utf8mb4_bin
wsrep_on = ON
wsrep_provider = {provider}
wsrep_cluster_name = quota-ledger-test
wsrep_cluster_address = gcomm://{peers}
wsrep_node_name = {name}
wsrep_node_address = 127.0.0.1
wsrep_node_incoming_address = 127.0.0.1:{port}
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:{sst}
wsrep_slave_threads = 2
wsrep_provider_options = "gmcast.listen_addr=tcp://127.0.0.1:{gcomm}; ist.recv_addr=127.0.0.1:{ist}; \
gcache.size=128M; evs.keepalive_period=PT0.5S; evs.suspect_timeout=PT2S; \
evs.inactive_timeout=PT4S; evs.install_timeout=PT4S"
"""


@dataclass(frozen=True, kw_only=True)
class NodePorts:
    sql: int
    gcomm: int
    ist: int
    sst: int


class GaleraNode:
    """One ``mariadbd`` of the cluster: ``start``, ``stop``, ``kill``, ``status``."""

    def __init__(self, root: Path, index: int, ports: NodePorts) -> None:
        self.index = index
        self.name = f"node{index}"
        self.ports = ports
        self.dir = root / self.name
        self.data = self.dir / "data"
        self.cnf = self.dir / "my.cnf"
        self.socket = self.dir / "mariadbd.sock"
        self.pid_file = self.dir / "mariadbd.pid"
        # written at start, before the server writes its own pid file (late, when it joins)
        self.started_pid = self.dir / "started.pid"
        self.log = self.dir / "error.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return self.ports.sql

    def url(self, database: str = "") -> str:
        """``mysql://root@127.0.0.1:PORT/DATABASE``: what :meth:`QuotaEngine.from_url` takes."""
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def write_config(self, peers: str) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        user = f"user = {SERVER_USER}" if os.geteuid() == 0 else ""
        self.cnf.write_text(
            _CNF.format(
                user=user, data=self.data, socket=self.socket, pid=self.pid_file, log=self.log,
                port=self.ports.sql, provider=PROVIDER, peers=peers, name=self.name,
                sst=self.ports.sst, gcomm=self.ports.gcomm, ist=self.ports.ist,
            )
        )  # fmt: skip

    def install(self) -> None:
        """``mariadb-install-db``: system tables, and root@localhost without a password."""
        command = [
            INSTALL_DB, f"--defaults-file={self.cnf}", "--skip-test-db", "--wsrep-on=OFF",
            "--auth-root-authentication-method=normal", f"--datadir={self.data}",
        ]  # fmt: skip
        if os.geteuid() == 0:
            command.append(f"--user={SERVER_USER}")
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise ClusterError(f"mariadb-install-db for {self.name} failed: {done.stderr.strip()[-2000:]}")

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, *, bootstrap: bool = False, timeout: float = 90) -> None:
        """Start the server and wait until it is synced with the cluster (after SST or IST)."""
        if self.running():
            raise ClusterError(f"{self.name} is already running (pid {self.pid()})")
        command = [str(MARIADBD), f"--defaults-file={self.cnf}"]
        if bootstrap:
            command.append("--wsrep-new-cluster")
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.dir,
            )  # fmt: skip
        self.started_pid.write_text(str(self._process.pid))
        self.wait_synced(timeout)

    def stop(self, timeout: float = 60) -> None:
        """A clean shutdown (SIGTERM): the node leaves the group and saves its position."""
        pid = self.pid()
        if pid is None or not _alive(pid):
            return
        os.kill(pid, signal.SIGTERM)
        if _wait_gone(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 10)
        self._reap()

    def kill(self) -> int:
        """``kill -9`` of the server; its pid."""
        pid = self.pid()
        if pid is None or not _alive(pid):
            raise ClusterError(f"{self.name} is not running")
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 10)
        self._reap()
        return pid

    def pid(self) -> int | None:
        if self._process is not None and self._process.poll() is None:
            return self._process.pid
        for source in (self.started_pid, self.pid_file):
            try:
                return int(source.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return None

    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and _alive(pid)

    def status(self) -> dict[str, str]:
        """The node's ``wsrep_%`` status variables (state, cluster size, ready, ...)."""
        rows = self.query("SHOW GLOBAL STATUS LIKE 'wsrep_%'")
        return {str(name): str(value) for name, value in rows}

    def wait_synced(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        last: object = "not started"
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise ClusterError(f"{self.name} exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                state = self.status()
            except pymysql.Error as error:
                last = error
            else:
                if state.get("wsrep_local_state_comment") == "Synced" and state.get("wsrep_ready") == "ON":
                    return
                last = state.get("wsrep_local_state_comment")
            time.sleep(0.2)
        raise ClusterError(f"{self.name} not synced after {timeout:.0f} s ({last}):\n{self.log_tail()}")

    def query(self, sql: str, database: str | None = None) -> list[tuple[Any, ...]]:
        """Run one statement on this node as root; its rows."""
        conn = pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", database=database,
            connect_timeout=3, read_timeout=30, autocommit=True,
        )  # fmt: skip
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql)
                return list(cursor.fetchall())
        finally:
            conn.close()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def _reap(self) -> None:
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
            self._process = None


class GaleraCluster:
    """Three (``size``) nodes under one root; ``start``, ``stop``, ``destroy``, per-node control."""

    def __init__(self, root: Path, ports: list[NodePorts]) -> None:
        self.root = root
        self.nodes = [GaleraNode(root, i + 1, p) for i, p in enumerate(ports)]

    @staticmethod
    def missing() -> list[str]:
        """The programs a cluster needs that this machine lacks."""
        missing = [str(p) for p in (MARIADBD, PROVIDER) if not p.is_file()]
        if shutil.which(INSTALL_DB) is None:
            missing.append(INSTALL_DB)
        if shutil.which("rsync") is None:
            missing.append("rsync (the state transfer method)")
        return missing

    @classmethod
    def create(cls, root: Path | None = None, *, size: int = 3) -> GaleraCluster:
        """Lay out a new cluster: free ports, one ``my.cnf`` per node, node 1's system tables."""
        if missing := cls.missing():
            needed = ", ".join(missing)
            raise ClusterError(f"missing for a Galera cluster: {needed} (install mariadb-server, galera-4)")
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="ql-galera-"))
        root.mkdir(parents=True, exist_ok=True)
        ports = [
            NodePorts(sql=free_port(), gcomm=free_port(), ist=free_port(), sst=free_port())
            for _ in range(size)
        ]
        made = cls(root, ports)
        made.configure()
        (root / STATE_FILE).write_text(json.dumps([asdict(p) for p in ports]))
        if os.geteuid() == 0:
            root.chmod(0o755)
            for path in [root, *root.rglob("*")]:
                shutil.chown(path, SERVER_USER, SERVER_USER)
        made.nodes[0].install()
        return made

    @classmethod
    def load(cls, root: Path) -> GaleraCluster:
        """The cluster laid out under ``root`` by :meth:`create` (another process's)."""
        try:
            ports = [NodePorts(**p) for p in json.loads((root / STATE_FILE).read_text())]
        except (OSError, ValueError, TypeError) as error:
            raise ClusterError(f"no Galera cluster under {root}: {error}") from error
        return cls(root, ports)

    def configure(self) -> None:
        peers = ",".join(f"127.0.0.1:{n.ports.gcomm}" for n in self.nodes)
        for node in self.nodes:
            node.write_config(peers)

    def start(self, timeout: float = 90) -> None:
        """Node 1 bootstraps a new group; the others join it one by one (one SST at a time)."""
        first, *others = self.nodes
        first.start(bootstrap=True, timeout=timeout)
        for node in others:
            node.start(timeout=timeout)
        self.wait_size(len(self.nodes), timeout)
        self.wait_synced(timeout)

    def wait_synced(self, timeout: float = 60) -> None:
        """Wait until every running node is synced: a donor of a state transfer is not for a
        while after its joiner is, and a client given the node list would skip it."""
        for node in self.nodes:
            if node.running():
                node.wait_synced(timeout)

    def stop(self) -> None:
        """Stop every node, the last one first, so node 1 leaves last and may bootstrap again."""
        for node in reversed(self.nodes):
            node.stop()

    def destroy(self) -> None:
        """Stop every node however it is (SIGKILL if a clean stop hangs) and delete the files."""
        for node in reversed(self.nodes):
            with contextlib.suppress(OSError):
                node.stop(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)

    def wait_size(self, size: int, timeout: float = 60, *, on: GaleraNode | None = None) -> None:
        """Wait until ``on`` (default: the first running node) sees a primary group of ``size``."""
        node = on or next(n for n in self.nodes if n.running())
        deadline = time.monotonic() + timeout
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                seen = node.status()
            except pymysql.Error:
                seen = {}
            if seen.get("wsrep_cluster_size") == str(size) and seen.get("wsrep_cluster_status") == "Primary":
                return
            time.sleep(0.2)
        raise ClusterError(f"cluster size on {node.name} is not {size}: {seen.get('wsrep_cluster_size')}")

    def create_database(self, name: str) -> list[str]:
        """``CREATE DATABASE`` on node 1 (replicated as DDL); one URL per node."""
        self.nodes[0].query(
            f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        )
        return [n.url(name) for n in self.nodes]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout: float) -> bool:
    """Wait for a process to exit; True when it is still alive afterwards."""
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False
