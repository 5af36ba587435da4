"""The callers' own log of acknowledged operations, and the checks of the tables against it.

Every reservation is made with an idempotency key, so a caller that retries after an outage
gets the original back. The log knows, per key, what was acknowledged last and which
operations are *in doubt* (given up on without an answer). At the end, with the database up
and the load stopped, the tables must agree with the log:

- every reservation row belongs to a key a caller used, and a refused reserve wrote none;
- no acknowledged operation is lost: the row is in the state the last acknowledgement says,
  unless a later operation on it is in doubt;
- no reservation is applied twice: at most one journal row per reservation, kind and resource;
- every queue and subtree counter equals the sum the log (plus the rows, for what the log
  leaves open: pending ones the sweeper may have expired, operations in doubt) gives.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

#: acknowledged states of a reservation, as the log records them
RESERVED, COMMITTED, ROLLED_BACK, EXPIRED, RELEASED = (
    "pending",
    "committed",
    "rolled_back",
    "expired",
    "released",
)


@dataclass
class Tracked:
    """One reservation key and what its callers were told."""

    key: str
    queue: str
    amounts: dict[str, int]
    reservation_id: str | None = None
    #: the state the last acknowledged operation left it in; None: no reserve acknowledged
    acked: str | None = None
    refused: bool = False
    #: operations given up on without an answer (their outcome is unknown)
    doubt: set[str] = field(default_factory=set)


class Books:
    """Shared by every worker of a run; every method takes the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tracked: dict[str, Tracked] = {}
        self.problems: list[str] = []

    def track(self, key: str, queue: str, amounts: dict[str, int]) -> Tracked:
        with self.lock:
            item = Tracked(key, queue, dict(amounts))
            self.tracked[key] = item
            return item

    def acknowledge(self, item: Tracked, operation: str, state: str | None, released: bool = False) -> None:
        """Record what a served call answered, and whether the answer is one it may give."""
        with self.lock:
            before = item.acked
            now = RELEASED if released and state == COMMITTED else state
            allowed = _ALLOWED.get(operation, {})
            if now not in allowed.get(before, set()):
                self.problems.append(f"{operation} of {item.key} answered {now} after {before}")
            item.acked = now

    def refuse(self, item: Tracked) -> None:
        with self.lock:
            item.refused = True

    def in_doubt(self, item: Tracked, operation: str) -> None:
        with self.lock:
            item.doubt.add(operation)


# operation -> state acknowledged before -> states its answer may leave the reservation in
_ALLOWED: dict[str, dict[str | None, set[str | None]]] = {
    # a retried reserve returns the original, in whatever state it is now
    "reserve": {None: {RESERVED, EXPIRED}},
    "commit": {RESERVED: {COMMITTED, EXPIRED}},
    "rollback": {RESERVED: {ROLLED_BACK, EXPIRED}},
    "release": {COMMITTED: {RELEASED}},
}


@dataclass
class Tables:
    """The ledger's rows as they are after a run."""

    reservations: dict[str, dict[str, Any]]  # key -> row with its items
    counters: dict[tuple[str, str, str], tuple[int, int, int | None]]  # (type, scope, res) -> counts
    journal_repeats: list[tuple[str, str, str, int]]


def read_tables(url: str, partition: str = "default") -> Tables:
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            'SELECT r.id, r."key", r.state, r.queue, r.released_at IS NOT NULL, i.resource, i.amount,'
            " i.committed FROM reservations r JOIN reservation_items i ON i.reservation_id = r.id"
            ' WHERE r."partition" = %s',
            (partition,),
        ).fetchall()
        counters = conn.execute(
            "SELECT scope_type, scope, resource, in_use, reserved, hard_limit FROM quota_usages"
            ' WHERE "partition" = %s',
            (partition,),
        ).fetchall()
        repeats = conn.execute(
            "SELECT reservation_id, kind, resource, count(*) FROM quota_journal"
            " WHERE reservation_id IS NOT NULL GROUP BY 1, 2, 3 HAVING count(*) > 1"
        ).fetchall()
    reservations: dict[str, dict[str, Any]] = {}
    for rid, key, state, queue, released, resource, amount, committed in rows:
        row = reservations.setdefault(
            key, {"id": rid, "state": state, "queue": queue, "released": released, "items": {}}
        )
        row["items"][resource] = (amount, committed)
    return Tables(
        reservations=reservations,
        counters={(t, s, r): (u, v, lim) for t, s, r, u, v, lim in counters},
        journal_repeats=[(str(a), b, c, int(d)) for a, b, c, d in repeats],
    )


def stored_state(row: Mapping[str, Any]) -> str:
    """The state of a reservation's row, ``released`` for a committed one that was released."""
    stored = RELEASED if row["state"] == COMMITTED and row["released"] else row["state"]
    return str(stored)


def check(books: Books, tables: Tables) -> dict[str, list[str]]:
    """Every invariant the log can decide, by name, with what broke it."""
    found: dict[str, list[str]] = {
        "unknown reservation": [],
        "refused reserve wrote a row": [],
        "acknowledged operation lost": [],
        "applied twice": [],
        "counter differs from the log": [],
        "limit exceeded at the end": [],
        "impossible answer": list(books.problems),
    }
    expected: Tally[tuple[str, str, str]] = Tally()  # (queue, resource, in_use|reserved) -> sum
    for key in tables.reservations.keys() - books.tracked.keys():
        found["unknown reservation"].append(key)
    for key, item in books.tracked.items():
        row = tables.reservations.get(key)
        if item.refused and row is not None and item.acked is None:
            found["refused reserve wrote a row"].append(key)
        if item.acked is not None:
            if row is None or row["id"] != item.reservation_id:
                found["acknowledged operation lost"].append(f"reserve {key}: no row {item.reservation_id}")
                continue
            stored = stored_state(row)
            if stored != item.acked and not _explained(item, stored):
                found["acknowledged operation lost"].append(f"{key}: acknowledged {item.acked}, row {stored}")
        if row is None:
            continue
        if row["queue"] != item.queue or {r: a for r, (a, _) in row["items"].items()} != item.amounts:
            found["acknowledged operation lost"].append(f"{key}: row holds {row['items']} at {row['queue']}")
        stored = stored_state(row)
        # Whole commits only: what is in use is what was asked for, by the log.
        what = {RESERVED: "reserved", COMMITTED: "in_use"}.get(stored or "")
        if what is not None:
            for resource, amount in item.amounts.items():
                expected[(item.queue, resource, what)] += amount
    for rid, kind, resource, count in tables.journal_repeats:
        found["applied twice"].append(f"{rid} {kind} {resource} x{count}")
    subtree: Tally[tuple[str, str, str]] = Tally()
    for (queue, resource, what), amount in expected.items():
        parts = queue.split(".")
        for depth in range(1, len(parts) + 1):
            subtree[(".".join(parts[:depth]), resource, what)] += amount
    for (scope_type, scope, resource), (in_use, reserved, limit) in tables.counters.items():
        want = expected if scope_type == "queue" else subtree
        if scope_type not in ("queue", "subtree"):
            continue
        if (in_use, reserved) != (want[(scope, resource, "in_use")], want[(scope, resource, "reserved")]):
            found["counter differs from the log"].append(
                f"{scope_type} {scope}/{resource}: in_use {in_use} reserved {reserved}, log says"
                f" {want[(scope, resource, 'in_use')]} and {want[(scope, resource, 'reserved')]}"
            )
        if limit is not None and in_use + reserved > limit:
            found["limit exceeded at the end"].append(f"{scope}/{resource}: {in_use}+{reserved} > {limit}")
    return found


def _explained(item: Tracked, stored: str) -> bool:
    """A row whose state the log does not show is fine when an operation that leads there is
    in doubt, or when the sweeper expired a reservation left pending."""
    if item.acked == RESERVED and stored == EXPIRED:
        return True
    leads_to = {"commit": {COMMITTED, EXPIRED}, "rollback": {ROLLED_BACK, EXPIRED}, "release": {RELEASED}}
    reachable = {state for op in item.doubt for state in leads_to.get(op, set())}
    if COMMITTED in reachable and "release" in item.doubt:
        reachable.add(RELEASED)
    return stored in reachable
