"""A PostgreSQL primary and a hot standby of the tests' own, streaming WAL, that they may kill.

Both are :class:`~pg_cluster.PgCluster` s (``tests/faults/pg_cluster.py``: Debian's PostgreSQL 15
binaries, run as ``postgres`` when started as root, free loopback ports, temporary directories).
The standby is a ``pg_basebackup -R`` of the running primary, so it streams from it as soon as
it starts, under the ``application_name`` ``standby``. With ``synchronous=True`` the primary's
``synchronous_standby_names`` names it: a commit returns once the standby has flushed it, and
waits while the standby is down. The machine's own PostgreSQL service is never touched.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import psycopg
from pg_cluster import ClusterError, PgCluster

STANDBY_NAME = "standby"
STATE_FILE = "replication.json"


class PgReplication:
    """``start`` (primary, base backup, standby), ``kill_primary``, ``promote``, ``destroy``."""

    def __init__(self, root: Path | None = None, *, synchronous: bool = False) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ql-pg-replication-")) if root is None else root
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self.synchronous = synchronous
        self.primary = PgCluster(
            self.root,
            settings={
                "cluster_name": "primary",
                "synchronous_standby_names": STANDBY_NAME if synchronous else "",
                "wal_keep_size": "256MB",  # the standby can fall behind without a slot
            },
        )
        self.standby: PgCluster | None = None

    @classmethod
    def load(cls, root: Path) -> PgReplication:
        """The pair another process started under ``root`` (see :meth:`save`)."""
        try:
            state = json.loads((root / STATE_FILE).read_text())
        except (OSError, ValueError) as error:
            raise ClusterError(f"no PostgreSQL replication under {root}: {error}") from error
        made = cls.__new__(cls)
        made.root, made.synchronous = root, bool(state["synchronous"])
        made.primary = PgCluster.attach(Path(state["primary"]["root"]), int(state["primary"]["port"]))
        made.standby = PgCluster.attach(Path(state["standby"]["root"]), int(state["standby"]["port"]))
        return made

    def save(self) -> None:
        standby = self._standby()
        state = {
            "synchronous": self.synchronous,
            "primary": {"root": str(self.primary.root), "port": self.primary.port},
            "standby": {"root": str(standby.root), "port": standby.port},
        }
        (self.root / STATE_FILE).write_text(json.dumps(state))

    def start(self, timeout: float = 60) -> None:
        """Start the primary, take the standby's base backup from it, start the standby."""
        self.primary.start(timeout)
        # A promoted standby must not wait for a standby of its own: it names none.
        self.standby = PgCluster(
            self.root,
            standby_of=self.primary,
            settings={"cluster_name": STANDBY_NAME, "synchronous_standby_names": ""},
        )
        self.standby.start(timeout)
        self.wait_streaming(timeout)

    def wait_streaming(self, timeout: float = 30) -> None:
        """Wait until the primary lists the standby as streaming (and as ``sync`` when it is)."""
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        seen: object = None
        while time.monotonic() < deadline:
            seen = self._one(
                self.primary,
                "SELECT state || ' ' || sync_state FROM pg_stat_replication WHERE application_name = %s",
                STANDBY_NAME,
            )
            if seen == f"streaming {want}":
                return
            time.sleep(0.1)
        raise ClusterError(f"the standby is not streaming ({want}) after {timeout:.0f} s: {seen}")

    def wait_replayed(self, timeout: float = 30) -> None:
        """Wait until the standby has replayed everything the primary has written so far."""
        target = self._one(self.primary, "SELECT pg_current_wal_lsn()::text")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            behind = self._one(self._standby(), "SELECT pg_last_wal_replay_lsn() < %s::pg_lsn", target)
            if behind is False:
                return
            time.sleep(0.05)
        raise ClusterError(f"the standby has not replayed up to {target} after {timeout:.0f} s")

    def in_recovery(self, cluster: PgCluster) -> bool:
        return bool(self._one(cluster, "SELECT pg_is_in_recovery()"))

    def kill_primary(self) -> list[int]:
        """``kill -9`` of the primary's postmaster; the pids of its orphaned backends."""
        return self.primary.kill_postmaster()

    def promote(self, timeout: float = 60) -> None:
        """``pg_ctl promote`` of the standby; returns once it takes writes."""
        standby = self._standby()
        standby.promote(timeout)
        deadline = time.monotonic() + timeout
        while self.in_recovery(standby):
            if time.monotonic() > deadline:
                raise ClusterError(f"the standby is still in recovery {timeout:.0f} s after promote")
            time.sleep(0.05)

    def create_database(self, name: str) -> tuple[str, str]:
        """``CREATE DATABASE`` on the primary, replicated to the standby; (primary URL, standby URL)."""
        self.primary.create_database(name)
        self.wait_replayed()
        return self.primary.url_for(name), self._standby().url_for(name)

    def stop(self) -> None:
        """Stop the standby, then the primary (a clean shutdown each)."""
        for cluster in (self.standby, self.primary):
            if cluster is not None and cluster.running():
                cluster.stop()

    def destroy(self) -> None:
        for cluster in (self.standby, self.primary):
            if cluster is not None:
                cluster.destroy()
        shutil.rmtree(self.root, ignore_errors=True)

    def _standby(self) -> PgCluster:
        if self.standby is None:
            raise ClusterError("the standby has not been made: call start() first")
        return self.standby

    @staticmethod
    def _one(cluster: PgCluster, sql: str, *args: object) -> object:
        with psycopg.connect(cluster.url, autocommit=True, connect_timeout=3) as conn:
            row = conn.execute(sql, args).fetchone()
        return None if row is None else row[0]
