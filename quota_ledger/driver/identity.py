"""User and group counters (``quota_identity_usages``): the last step of the lock order in
:mod:`.tx`, sorted by (kind, name, queue, resource)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select, update

from quota_ledger.driver import dialect, inline
from quota_ledger.driver.counters import force_index
from quota_ledger.driver.pg_cursor import PgCursor
from quota_ledger.driver.schema import quota_identity_usages
from quota_ledger.model.counters import Counter

_D = quota_identity_usages.c
_IDENTITY_COLUMNS = (_D.id, _D.kind, _D.name, _D.queue, _D.resource, _D.in_use, _D.reserved, _D.hard_limit)
_IDENTITY_INDEX = "uq_quota_identity_usages_partition_kind_name_queue_resource"
_PG_IDENTITY = "id, kind, name, queue, resource, in_use, reserved, hard_limit"
# lock_identity_counters: the counters of kinds x names x queues x resources (step 7).
_LOCK_IDENTITY = force_index(
    select(*_IDENTITY_COLUMNS)
    .where(
        _D.partition == bindparam("p"),
        _D.kind.in_(bindparam("kinds", expanding=True)),
        _D.name.in_(bindparam("names", expanding=True)),
        _D.queue.in_(bindparam("queues", expanding=True)),
        _D.resource.in_(bindparam("resources", expanding=True)),
    )
    .order_by(_D.kind, _D.name, _D.queue, _D.resource)
    .with_for_update(),
    quota_identity_usages,
    _IDENTITY_INDEX,
)
PG_LOCK_IDENTITY = (
    f'SELECT {_PG_IDENTITY} FROM quota_identity_usages WHERE "partition" = %(p)s'  # noqa: S608
    " AND kind = ANY(%(kinds)s) AND name = ANY(%(names)s) AND queue = ANY(%(queues)s)"
    " AND resource = ANY(%(resources)s) ORDER BY kind, name, queue, resource FOR UPDATE"
)
# lock_identity_keys: the counters of whole keys (step 7), one lookup each, where the product
# above takes every combination of the keys' parts: hundreds of lookups for a batch of users on
# deep queues, a few dozen of them counters anyone asked for. Written as the driver's text (see
# inline), {keys} the placeholders of the keys: on MariaDB a row value IN (a range on the whole
# unique key); on SQLite one lookup per key, OR-ed, as its planner looks a row value IN up by
# its first column only (the partition's every counter). At most a slice of keys a statement
# (see KEY_SLICE), so that the largest request the bounds allow fits each backend's limits.
_MY_LOCK_IDENTITY_KEYS = (
    f"SELECT {_PG_IDENTITY} FROM quota_identity_usages FORCE INDEX ({_IDENTITY_INDEX})"  # noqa: S608
    " WHERE `partition` = %s AND (kind, name, queue, resource) IN ({keys})"
    " ORDER BY kind, name, queue, resource FOR UPDATE"
)
_SQLITE_IDENTITY_KEYS = (
    f"SELECT {_PG_IDENTITY} FROM quota_identity_usages WHERE {{keys}}"  # noqa: S608
    " ORDER BY kind, name, queue, resource"
)
_SQLITE_IDENTITY_KEY = '("partition" = ? AND kind = ? AND name = ? AND queue = ? AND resource = ?)'
#: keys one lock_identity_keys statement names at most; more take one statement per slice, in key
#: order, so the rows are still locked in the canonical order. A user and a group on a queue 126
#: levels deep, for 64 resources and the running applications, are 16,380 keys. SQLite nests an
#: OR chain one level a term and refuses a statement nested deeper than 1,000 (and, in builds
#: before 3.32, one of more than 999 parameters: five a key); MariaDB's statement stays far below
#: max_allowed_packet whatever the names' lengths (four names of up to 255 characters a key).
KEY_SLICE = {"sqlite": 192, "mariadb": 1024}


# all_identity_counters: every counter of some kinds in a partition; no lock.
_ALL_IDENTITY = (
    select(*_IDENTITY_COLUMNS)
    .where(_D.partition == bindparam("p"), _D.kind.in_(bindparam("kinds", expanding=True)))
    .order_by(_D.kind, _D.name, _D.queue, _D.resource)
)
# lock_all_identity_counters: the same, locked (config apply and audit fix, step 7).
_LOCK_ALL_IDENTITY = force_index(_ALL_IDENTITY.with_for_update(), quota_identity_usages, _IDENTITY_INDEX)
# apply_identity_deltas: adds to counters this transaction has locked (see add_to_locked).
PG_APPLY_IDENTITY = (
    "UPDATE quota_identity_usages SET in_use = quota_identity_usages.in_use + d.di,"
    " reserved = quota_identity_usages.reserved + d.dr, updated_at = %(now)s"
    " FROM unnest(%(ids)s::bigint[], %(dis)s::bigint[], %(drs)s::bigint[]) AS d(id, di, dr)"
    " WHERE quota_identity_usages.id = d.id"
)
_SET_IDENTITY = (
    update(quota_identity_usages)
    .where(_D.id == bindparam("cid"))
    .values(
        in_use=bindparam("v_in_use"),
        reserved=bindparam("v_reserved"),
        hard_limit=bindparam("lim"),
        updated_at=bindparam("now"),
    )
)
_DELETE_IDENTITY = delete(quota_identity_usages).where(_D.id.in_(bindparam("ids", expanding=True)))


class IdentityStatements:
    """The statements above, as methods of :class:`~quota_ledger.driver.tx.LedgerTx`."""

    conn: Connection
    backend: str
    pg: PgCursor | None
    deferred: list[inline.Statement] | None

    def lock_identity_counters(
        self,
        partition: str,
        names: Iterable[tuple[str, str]],
        queues: Iterable[str],
        resources: Iterable[str],
    ) -> list[Counter]:
        """Lock the user/group counters of (kind, name) pairs x queues x resources.

        The query takes the cross product of kinds and names; rows of a pair not asked for
        are locked too (in the same canonical order) but not returned.
        """
        pairs = set(names)
        queue_list, resource_list = sorted(set(queues)), sorted(set(resources))
        if not pairs or not queue_list or not resource_list:
            return []
        params = {
            "p": partition,
            "kinds": sorted({k for k, _ in pairs}),
            "names": sorted({n for _, n in pairs}),
            "queues": queue_list,
            "resources": resource_list,
        }
        if self.pg is not None:
            rows: Sequence[Any] = self.pg.all(PG_LOCK_IDENTITY, params)
        else:
            rows = self.conn.execute(_LOCK_IDENTITY, params).all()
        return [c for row in rows if ((c := _identity(row)).scope_type, c.name) in pairs]

    def lock_identity_keys(self, partition: str, keys: Iterable[tuple[str, str, str, str]]) -> list[Counter]:
        """Lock the user/group counters of whole (kind, name, queue, resource) keys that exist,
        in the canonical order (on PostgreSQL by :meth:`lock_identity_counters`, its arrays of
        any length; elsewhere one statement a slice of :data:`KEY_SLICE` sorted keys)."""
        wanted = sorted(set(keys))
        if not wanted:
            return []
        if self.pg is not None:
            found = self.lock_identity_counters(
                partition,
                {(k, n) for k, n, _, _ in wanted},
                {q for _, _, q, _ in wanted},
                {r for _, _, _, r in wanted},
            )
            chosen = set(wanted)
            return [c for c in found if (c.scope_type, c.name or "", c.scope, c.resource) in chosen]
        sqlite = self.backend == "sqlite"
        size = KEY_SLICE["sqlite" if sqlite else "mariadb"]
        locked: list[Counter] = []
        for start in range(0, len(wanted), size):
            part = wanted[start : start + size]
            if sqlite:
                sql = _SQLITE_IDENTITY_KEYS.format(keys=" OR ".join([_SQLITE_IDENTITY_KEY] * len(part)))
                params: list[str] = [value for key in part for value in (partition, *key)]
            else:
                sql = _MY_LOCK_IDENTITY_KEYS.format(keys=",".join(["(%s,%s,%s,%s)"] * len(part)))
                params = [partition, *(value for key in part for value in key)]
            locked += [_identity(row) for row in inline.rows(self.conn, sql, params)]
        return locked

    def identity_counters(
        self, partition: str, *, lock: bool, kinds: Iterable[str] = ("group", "user")
    ) -> list[Counter]:
        """Every counter of ``kinds`` in a partition. Locking order: user/group counters first,
        then (in a call of their own) ResourceQuota counters, on every path."""
        params = {"p": partition, "kinds": sorted(kinds)}
        rows = self.conn.execute(_LOCK_ALL_IDENTITY if lock else _ALL_IDENTITY, params)
        return [_identity(row) for row in rows]

    def apply_identity_deltas(self, deltas: Mapping[int, tuple[int, int]], now: datetime) -> None:
        changes = sorted((cid, d) for cid, d in deltas.items() if d[0] or d[1])
        if changes and self.pg is not None:
            self.pg.run(
                PG_APPLY_IDENTITY,
                {
                    "ids": [cid for cid, _ in changes],
                    "dis": [d[0] for _, d in changes],
                    "drs": [d[1] for _, d in changes],
                    "now": now,
                },
            )
        else:
            statements = inline.add_to_locked(self.conn, quota_identity_usages, changes, now)
            inline.write(self.conn, self.deferred, statements)

    def set_identity_counters(self, values: Mapping[int, tuple[int, int, int]], now: datetime) -> None:
        """Set (in_use, reserved, limit) of locked counters."""
        params = [
            {"cid": cid, "v_in_use": i, "v_reserved": r, "lim": lim, "now": now}
            for cid, (i, r, lim) in sorted(values.items())
        ]
        if params:
            self.conn.execute(_SET_IDENTITY, params)

    def delete_identity_counters(self, ids: Sequence[int]) -> None:
        if ids:
            self.conn.execute(_DELETE_IDENTITY, {"ids": sorted(ids)})

    def insert_identity_counters(
        self, partition: str, rows: Mapping[tuple[str, str, str, str], tuple[int, int, int]], now: datetime
    ) -> None:
        """Create counters ``(kind, name, queue, resource) -> (in_use, reserved, limit)``,
        skipping any a concurrent transaction created first."""
        if not rows:
            return
        self.conn.execute(
            dialect.insert_ignoring_duplicates(self.backend, quota_identity_usages),
            [
                {
                    "partition": partition,
                    "kind": kind,
                    "name": name,
                    "queue": queue,
                    "resource": resource,
                    "in_use": in_use,
                    "reserved": reserved,
                    "hard_limit": limit,
                    "updated_at": now,
                }
                for (kind, name, queue, resource), (in_use, reserved, limit) in sorted(rows.items())
            ],
        )


def _identity(row: Any) -> Counter:
    return Counter(
        id=row.id,
        scope_type=row.kind,
        scope=row.queue,
        resource=row.resource,
        in_use=row.in_use,
        reserved=row.reserved,
        limit=row.hard_limit,
        name=row.name,
    )
