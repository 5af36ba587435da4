"""One ``mariadbd`` without replication, made and configured as a node of :mod:`galera` is: the
same server and settings with ``wsrep_on = OFF``, to measure what the cluster costs."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import pymysql
from galera import SERVER_USER, GaleraNode, NodePorts
from pg_cluster import ClusterError, free_port


class StandaloneNode(GaleraNode):
    """One ``mariadbd`` made and configured as a Galera node is, with ``wsrep_on = OFF``: the same
    server and settings without replication, to measure what the cluster costs."""

    def __init__(self, root: Path, ports: NodePorts) -> None:
        super().__init__(root, 0, ports)
        self.name = "standalone"
        self.dir = root / self.name
        for name in ("data", "cnf", "socket", "pid_file", "started_pid", "log"):
            setattr(self, name, self.dir / getattr(self, name).name)

    @classmethod
    def create(cls, root: Path | None = None) -> StandaloneNode:
        """Lay out, install and return a stopped node (``start`` it, ``destroy`` it)."""
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="ql-mariadb-"))
        made = cls(root, NodePorts(sql=free_port(), gcomm=free_port(), ist=free_port(), sst=free_port()))
        made.write_config("")
        if os.geteuid() == 0:
            root.chmod(0o755)
            for path in [root, *root.rglob("*")]:
                shutil.chown(path, SERVER_USER, SERVER_USER)
        made.install()
        return made

    def write_config(self, peers: str) -> None:
        super().write_config(peers)
        lines = self.cnf.read_text().splitlines()
        kept = [line for line in lines if not line.startswith(("wsrep_", "gcache", "evs."))]
        self.cnf.write_text("\n".join([*kept, "wsrep_on = OFF", ""]))

    def wait_synced(self, timeout: float = 90) -> None:
        """Wait until the server answers (there is no group to be synced with)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._process is not None and self._process.poll() is not None:
                raise ClusterError(f"{self.name} exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                self.query("SELECT 1")
                return
            except pymysql.Error as error:
                if time.monotonic() > deadline:
                    raise ClusterError(f"{self.name} not answering after {timeout:.0f} s: {error}") from error
            time.sleep(0.2)

    def create_database(self, name: str) -> str:
        self.query(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return self.url(name)

    def destroy(self) -> None:
        with contextlib.suppress(OSError):
            self.stop(timeout=30)
        shutil.rmtree(self.dir.parent, ignore_errors=True)
