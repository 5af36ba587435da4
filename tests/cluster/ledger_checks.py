"""What must hold on every node of a cluster under load: no counter over its limit at any moment
(:class:`Sampler`), every acknowledged operation in the tables (:func:`lost_acks`), and the same
ledger tables on every node (:func:`checksums`, :func:`wait_identical`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol

import ledger_load
import pymysql
from ledger_load import Ack

from quota_ledger.driver.schema import metadata

#: the ledger's tables, compared across nodes
TABLES = sorted(t.name for t in metadata.sorted_tables)

# Every subtree counter with a limit whose usage is above it, as one consistent read.
_OVER_LIMIT = (
    "SELECT scope, resource, in_use, reserved, hard_limit FROM `{db}`.quota_usages "
    "WHERE scope_type = 'subtree' AND hard_limit IS NOT NULL AND in_use + reserved > hard_limit"
)


class Node(Protocol):
    """A server of the cluster (:class:`galera.GaleraNode`)."""

    name: str

    @property
    def port(self) -> int: ...

    def running(self) -> bool: ...

    def query(self, sql: str, database: str | None = None) -> list[tuple[object, ...]]: ...


class Sampler:
    """Every ``interval`` seconds, on every running node: the counters over their limits.

    A node that does not answer (killed, rejoining) is skipped and counted in ``unreachable``."""

    def __init__(self, nodes: Sequence[Node], database: str, interval: float = 0.1) -> None:
        self.nodes = list(nodes)
        self.database = database
        self.interval = interval
        self.samples: Counter[str] = Counter()
        self.over: Counter[str] = Counter()
        self.unreachable: Counter[str] = Counter()
        self.examples: list[tuple[str, tuple[object, ...]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._connections: dict[str, pymysql.connections.Connection] = {}

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> Sampler:
        self._stop.set()
        self._thread.join(30)
        for conn in self._connections.values():
            with contextlib.suppress(pymysql.Error):
                conn.close()
        return self

    @property
    def violations(self) -> int:
        return sum(self.over.values())

    def summary(self) -> str:
        return (
            f"samples {dict(self.samples)}, over-limit samples {dict(self.over)}, "
            f"unreachable {dict(self.unreachable)}"
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for node in self.nodes:
                if node.running():
                    self._sample(node)

    def _sample(self, node: Node) -> None:
        try:
            conn = self._connections.get(node.name)
            if conn is None:
                conn = pymysql.connect(
                    host="127.0.0.1", port=node.port, user="root", connect_timeout=1,
                    read_timeout=2, write_timeout=2, autocommit=True,
                )  # fmt: skip
                self._connections[node.name] = conn
            with conn.cursor() as cursor:
                cursor.execute(_OVER_LIMIT.format(db=self.database))
                rows = list(cursor.fetchall())
        except pymysql.Error:
            self.unreachable[node.name] += 1
            dropped = self._connections.pop(node.name, None)
            if dropped is not None:
                with contextlib.suppress(pymysql.Error):
                    dropped.close()
            return
        self.samples[node.name] += 1
        if rows:
            self.over[node.name] += 1
            self.examples += [(node.name, row) for row in rows[:3]]


def lost_acks(node: Node, database: str, acks: Mapping[str, Ack]) -> list[str]:
    """Every acknowledged operation ``node``'s tables do not show (empty: none lost)."""
    rows = node.query(f"SELECT id, `key`, state, released_at IS NOT NULL FROM `{database}`.reservations")
    stored = {str(rid): (str(key), str(state), bool(released)) for rid, key, state, released in rows}
    return ledger_load.lost(node.name, stored, acks)


def writers(nodes: Sequence[Node], database: str) -> list[str]:
    """The nodes with client sessions on ``database``: the sampler's sessions name none, and
    Galera's appliers (``system user``) show the database of the write set they apply."""
    sql = (
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
        f"WHERE DB = '{database}' AND USER <> 'system user'"
    )
    return [node.name for node in nodes if node.running() and int(str(node.query(sql)[0][0])) > 0]


def checksums(node: Node, database: str) -> dict[str, int]:
    """``CHECKSUM TABLE ... EXTENDED`` of every ledger table on ``node``."""
    tables = ", ".join(f"`{database}`.`{t}`" for t in TABLES)
    return {str(name): int(str(value)) for name, value in node.query(f"CHECKSUM TABLE {tables} EXTENDED")}


def wait_identical(nodes: Sequence[Node], database: str, timeout: float = 30) -> list[dict[str, int]]:
    """Wait until every node has applied the same writes (a write set is certified everywhere
    before the writer's commit returns, applied asynchronously after); every node's checksums."""
    deadline = time.monotonic() + timeout
    while True:
        sums = [checksums(node, database) for node in nodes]
        if all(s == sums[0] for s in sums) or time.monotonic() > deadline:
            return sums
        time.sleep(0.2)
