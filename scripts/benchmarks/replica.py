"""The psycopg replica: the library's reserve and commit hand-written on raw psycopg 3, and the
check that one library pair and one replica pair send the very same statements."""

from __future__ import annotations

import hashlib
import json
import random
import re
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import namedtuple_row
from sqlalchemy import Engine, event

from benchmarks.database import config_version
from benchmarks.harness import BenchError
from benchmarks.workload import (
    AMOUNTS,
    KUBE_JSON,
    PARTITION,
    PG_LOCK_KEY,
    RESOURCES,
    TTL,
    LibraryWorker,
    QueuePicker,
    spread_queue,
)
from quota_ledger import QuotaEngine
from quota_ledger.driver import pg_cursor, pg_functions
from quota_ledger.driver.dialect import ADVISORY_NAMESPACE

_RETRYABLE = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure, pg_errors.LockNotAvailable)


class PsycopgWorker:
    """The library's reserve and commit, hand-written on one psycopg connection.

    The very same statements (``quota_ledger.driver.pg_functions``: one call of a set function
    for one request per transaction, in autocommit), the same parameters; only the Python around
    them is minimal. psycopg prepares statements after five executions, as in the library.
    """

    def __init__(self, dsn: str, pick: QueuePicker, seed: int, version: int) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.cur = self.conn.cursor(row_factory=namedtuple_row)
        self.pick = pick
        self.rng = random.Random(seed)
        self.version = version
        self.retries = 0
        #: when a list, every statement sent is recorded for the shape check
        self.trace: list[str] | None = None

    def close(self) -> None:
        self.conn.close()

    def _call(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        if self.trace is not None:
            self.trace.append(statement_shape(sql, 1))
        for _attempt in range(10):
            try:
                return self.cur.execute(sql, params).fetchall()
            except _RETRYABLE:
                self.retries += 1
        raise BenchError("psycopg worker: gave up after 10 attempts")

    def pair(self) -> None:
        self.commit(self.reserve(self.pick(self.rng)))

    def reserve(self, queue: str) -> str:
        rid = str(uuid.uuid4())
        digest = hashlib.sha256(
            json.dumps(
                {
                    "p": PARTITION,
                    "q": queue,
                    "r": AMOUNTS,
                    "g": [],
                    "user": None,
                    "application": None,
                    "priority_class": None,
                },
                sort_keys=True,
                separators=(",", ":"),
            ).encode()
        ).hexdigest()
        params = {
            "id": rid,
            "partition": PARTITION,
            "key": None,
            "request_hash": digest,
            "queue": queue,
            "resources": list(RESOURCES),
            "amounts": [AMOUNTS[r] for r in RESOURCES],
            "ttl_us": TTL // timedelta(microseconds=1),
            "priority_class": None,
            "kube": KUBE_JSON,
            "version": self.version,
            "ns": ADVISORY_NAMESPACE,
            "k": PG_LOCK_KEY,
            "quota_names": [],
            "quota_resources": [],
            "quota_amounts": [],
            "user": None,
            "groups": None,
            "application": None,
            "app_key": None,
            "group": None,
            "id_kinds": [],
            "id_names": [],
            "id_queues": [],
            "id_resources": [],
            "id_amounts": [],
            "id_limits": [],
        }
        call = pg_functions.reserve_many([params])
        if not self._call(call.sql, call.sent()):
            raise BenchError(f"psycopg worker: reservation in {queue} was declined")
        return rid

    def commit(self, rid: str) -> None:
        call = pg_functions.commit_many([pg_functions.commit_params(rid, str(uuid.uuid4()))])
        rows = self._call(call.sql, call.sent())
        if not rows:
            raise BenchError(f"psycopg worker: reservation {rid} was not committed")


_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE)\s+([a-z_]+)", re.IGNORECASE)


def statement_shape(sql: str, rows: int) -> str:
    """A statement as the shape check compares it: verb, target, lock, executemany rows."""
    text = " ".join(sql.split())
    verb = text.split(" ", 1)[0].upper()
    if function := re.search(r"\b(quota_ledger_[a-z_]+)\(", text):
        target = f"{function.group(1)}()"
    elif "pg_advisory" in text:
        target = "advisory lock + clock"
    else:
        match = _TABLE.search(text)
        target = match.group(1) if match else "?"
    lock = " FOR UPDATE" if "FOR UPDATE" in text.upper() else ""
    many = f" x{rows} (executemany)" if rows > 1 else ""
    return f"{verb} {target}{lock}{many}"


def shape_check(engine: QuotaEngine, dsn: str) -> dict[str, Any]:
    """Record what one library pair and one psycopg pair send; they must be the same shape."""
    library: list[str] = []

    def listen(_conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, many: bool) -> None:
        library.append(statement_shape(statement, len(parameters) if many else 1))

    def on_begin(_conn: Any) -> None:
        library.append("BEGIN")

    def on_commit(_conn: Any) -> None:
        library.append("COMMIT")

    target = engine.driver.engine
    fast_run = pg_cursor.PgCursor.run
    function_call = pg_functions.call

    def traced_run(self: pg_cursor.PgCursor, sql: str, params: Any) -> Any:
        library.append(statement_shape(sql, 1))
        return fast_run(self, sql, params)

    def traced_call(engine: Engine, sql: str, params: Mapping[str, Any]) -> list[Any] | None:
        library.append(statement_shape(sql, 1))
        return function_call(engine, sql, params)

    # One untraced pair first: the engine compiles the configuration in force once per version.
    LibraryWorker(engine, lambda _rng: spread_queue(0), 1).pair()
    event.listen(target, "before_cursor_execute", listen)
    event.listen(target, "begin", on_begin)
    event.listen(target, "commit", on_commit)
    pg_cursor.PgCursor.run = traced_run  # type: ignore[method-assign]
    pg_functions.call = traced_call
    try:
        LibraryWorker(engine, lambda _rng: spread_queue(0), 0).pair()
    finally:
        pg_cursor.PgCursor.run = fast_run  # type: ignore[method-assign]
        pg_functions.call = function_call
        event.remove(target, "before_cursor_execute", listen)
        event.remove(target, "begin", on_begin)
        event.remove(target, "commit", on_commit)

    worker = PsycopgWorker(dsn, lambda _rng: spread_queue(0), 0, config_version(dsn))
    raw: list[str] = []
    worker.trace = raw
    try:
        worker.commit(worker.reserve(spread_queue(0)))
    finally:
        worker.close()
    same = raw == library
    # Round trips: each statement (an autocommit function call is one), BEGIN and COMMIT.
    return {"library": library, "psycopg": raw, "identical": same, "round_trips_per_pair": len(library)}
