"""What must hold on a PostgreSQL server under load: no counter over its limit at any moment
(:class:`OverLimitSampler`), and every acknowledged operation in its tables (:func:`lost_acks`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import ledger_load
import psycopg
from ledger_load import Ack


def lost_acks(url: str, acks: Mapping[str, Ack]) -> list[str]:
    """Every acknowledged operation the server at ``url`` does not show (read in one statement,
    not through the engine)."""
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute("SELECT id, key, state, released_at IS NOT NULL FROM reservations").fetchall()
    stored = {str(rid): (str(key), str(state), bool(released)) for rid, key, state, released in rows}
    return ledger_load.lost(url.rsplit("@", 1)[-1], stored, acks)


class OverLimitSampler:
    """Reads every limited counter of one server every ``every`` seconds on a thread of its own,
    counting the counters over their limit (``in_use + reserved > hard_limit``) in each sample.
    A server that does not answer is a failed sample, and the sampler tries again."""

    QUERY = (
        "SELECT count(*), count(*) FILTER (WHERE in_use + reserved > hard_limit)"
        " FROM quota_usages WHERE hard_limit IS NOT NULL"
    )

    def __init__(self, url: str, every: float = 0.1) -> None:
        self.url = url.replace("+psycopg", "")
        self.every = every
        self.samples = 0
        self.failed = 0
        #: samples that found a counter over its limit, and the counters found over it
        self.violations = 0
        self.over = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        conn: psycopg.Connection[tuple[int, int]] | None = None
        while not self._stop.wait(self.every):
            try:
                if conn is None:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=1)
                row = conn.execute(self.QUERY).fetchone()
            except psycopg.Error:
                self.failed += 1
                if conn is not None:
                    conn.close()
                conn = None
                continue
            assert row is not None
            self.samples += 1
            if row[1]:
                self.violations += 1
                self.over += row[1]
        if conn is not None:
            conn.close()
