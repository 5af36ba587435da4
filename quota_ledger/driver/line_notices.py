"""PostgreSQL ``LISTEN``/``NOTIFY`` for the waiting lines: a request that leaves its line (granted,
cancelled, expired) notifies channel :data:`CHANNEL`, in the transaction that made it leave, so
the notice is sent when, and only when, that transaction commits. The payload is the partition,
then a TAB and the request's id when one request left (a grant, a cancel): a listener then reads
that request's row only. A :class:`Listener` holds one connection of its own that listens, for
the engine's granter.

Elsewhere (MariaDB, SQLite) there are no notices: the granter polls."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, text

log = logging.getLogger(__name__)

CHANNEL = "quota_ledger_line"
_NOTIFY = text(f"SELECT pg_notify('{CHANNEL}', :p)")


def notify(conn: Connection, partition: str, reservation_id: str | None = None) -> None:
    """Notify the listeners that a request of ``partition`` (``reservation_id``, when one) left
    its line, at commit (PostgreSQL; elsewhere nothing)."""
    if conn.dialect.name == "postgresql":
        conn.execute(_NOTIFY, {"p": payload(partition, reservation_id)})


def payload(partition: str, reservation_id: str | None = None) -> str:
    """A notice's payload: the partition, and the id of the request that left, if one did."""
    return partition if reservation_id is None else f"{partition}\t{reservation_id}"


def parse(payload: str) -> tuple[str, str | None]:
    """(partition, id of the request that left, if the notice names one) of a notice's payload."""
    partition, _, reservation_id = payload.partition("\t")
    return partition, reservation_id or None


class Listener:
    """A thread that listens on :data:`CHANNEL` on a connection of its own and calls ``heard``
    with the partition and the request id (None if it names none) of each notice; it reconnects
    after ``retry`` seconds when the connection fails (a failover), and stops with :meth:`close`.
    :attr:`live` says whether it listens now; each time it starts listening (again) it calls
    ``heard`` with no partition: notices sent before then were not heard."""

    def __init__(
        self, engine: Engine, heard: Callable[[str | None, str | None], None], retry: float = 1.0
    ) -> None:
        self.engine = engine
        self.heard = heard
        self.retry = retry
        #: whether the connection listens now
        self.live = False
        self._stop = threading.Event()
        self._raw: Any = None
        self._thread = threading.Thread(target=self._run, name="quota-ledger-line-listener", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as error:  # a lost connection: listen again after a pause
                log.warning(
                    "listening for waiting-line notices failed, again in %.1f s: %s", self.retry, error
                )
                self._stop.wait(self.retry)
            finally:
                self.live = False
                self._drop()

    def _listen(self) -> None:
        raw = self._raw = self.engine.raw_connection()
        conn: Any = raw.driver_connection
        conn.autocommit = True
        conn.execute(f"LISTEN {CHANNEL}")
        self.live = True
        self.heard(None, None)
        while not self._stop.is_set():
            for notice in conn.notifies(timeout=0.5, stop_after=64):
                self.heard(*parse(notice.payload))

    def _drop(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            with contextlib.suppress(Exception):  # closing a connection that may have failed
                raw.invalidate()  # never back to the pool: it listens
