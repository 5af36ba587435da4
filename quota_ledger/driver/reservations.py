"""Reservation headers and items (``reservations``, ``reservation_items``): step 3 of the
lock order in :mod:`.tx`. New rows are written before any counter is locked."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Integer, and_, bindparam, or_, select, update
from sqlalchemy import insert as sa_insert

from quota_ledger.driver import dialect, inline
from quota_ledger.driver.pg_cursor import Call, PgCursor
from quota_ledger.driver.schema import PENDING, reservation_items, reservations
from quota_ledger.model.values import Reservation, ReservationState, StoredReservation

_R = reservations.c
_I = reservation_items.c
_HEADER = (
    _R.id,
    _R.partition,
    _R.key,
    _R.request_hash,
    _R.state,
    _R.queue,
    _R.user_name,
    _R.groups,
    _R.application,
    _R.priority_class,
    _R.created_at,
    _R.expires_at,
    _R.resolved_at,
    _R.kube,
    _R.released_at,
    _R.priority,
)
_ITEM = (_I.resource, _I.amount, _I.committed)
_JOINED = reservations.outerjoin(reservation_items, _I.reservation_id == _R.id)
PG_HEADER = (
    'r.id, r."partition", r."key", r.request_hash, r.state, r.queue, r.user_name, r."groups",'
    " r.application, r.priority_class, r.created_at, r.expires_at, r.resolved_at, r.kube, r.released_at,"
    " r.priority, i.resource, i.amount, i.committed"
)
# find_reservation_by_key: no lock (idempotency check before any lock is taken).
_FIND_BY_KEY = (
    select(*_HEADER, *_ITEM)
    .select_from(_JOINED)
    .where(_R.partition == bindparam("p"), _R.key == bindparam("key"))
)
PG_FIND_BY_KEY = (
    f"SELECT {PG_HEADER} FROM reservations r LEFT JOIN reservation_items i ON i.reservation_id = r.id"  # noqa: S608 - constants only
    ' WHERE r."partition" = %(p)s AND r."key" = %(key)s'
)
# find_reservation: no lock.
_FIND_BY_ID = select(*_HEADER, *_ITEM).select_from(_JOINED).where(_R.id == bindparam("id"))
# lock_reservation: locks the reservation header row (step 3) and reads the clock. MariaDB's
# locking read returns the newest committed rows, and SQLite writes one at a time, so there the
# header and its items come with the lock. On PostgreSQL, under READ COMMITTED, a row lock that
# waited for another transaction refreshes the locked row alone: the items joined beside it
# would still be those of the statement's snapshot, from before that transaction (a release
# racing a commit would see the reservation committed with nothing committed). There the lock
# is one statement and the read a second one, with a snapshot taken after the lock.
_LOCK_BY_ID = (
    select(*_HEADER, *_ITEM, dialect.utcnow().label("db_now"))
    .select_from(_JOINED)
    .where(_R.id == bindparam("id"))
    .with_for_update(of=reservations)
)
PG_LOCK_BY_ID = (
    "SELECT TIMEZONE('UTC', clock_timestamp()) AS db_now FROM reservations WHERE id = %(id)s FOR UPDATE"
)
PG_READ_BY_ID = (
    f"SELECT {PG_HEADER} FROM reservations r LEFT JOIN reservation_items i ON i.reservation_id = r.id"  # noqa: S608 - constants only
    " WHERE r.id = %(id)s"
)
# lock_expired: locks up to :n expired pending reservations, skipping rows others hold (step 3).
# :now is bound (read from the database first): a volatile clock call here would keep PostgreSQL
# from using the (partition, state, expires_at) index.
_EXPIRED_IDS = (
    select(_R.id)
    .where(_R.partition == bindparam("p"), _R.state == PENDING, _R.expires_at <= bindparam("now"))
    .order_by(_R.expires_at)
    .limit(bindparam("n", type_=Integer))
)
_LOCK_EXPIRED_IDS = _EXPIRED_IDS.with_for_update(skip_locked=True)
# On PostgreSQL one statement locks the batch and returns it with its items.
PG_LOCK_EXPIRED = (
    "WITH locked AS (SELECT id FROM reservations"  # noqa: S608 - constants only
    " WHERE \"partition\" = %(p)s AND state = 'pending' AND expires_at <= %(now)s"
    " ORDER BY expires_at LIMIT %(n)s FOR UPDATE SKIP LOCKED)"
    f" SELECT {PG_HEADER} FROM locked JOIN reservations r ON r.id = locked.id"
    " LEFT JOIN reservation_items i ON i.reservation_id = r.id"
)
# MariaDB keeps its locks on index entries it skipped through the secondary index, which lets
# a sweep block a commit; there the candidates are read without locks, then locked by key.
_LOCK_IDS_IF_PENDING = (
    select(_R.id)
    .where(_R.id.in_(bindparam("ids", expanding=True)), _R.state == "pending")
    .order_by(_R.id)
    .with_for_update(skip_locked=True)
)
# read_reservations: headers and items of rows this transaction already locked; no new lock.
_READ_MANY = select(*_HEADER, *_ITEM).select_from(_JOINED).where(_R.id.in_(bindparam("ids", expanding=True)))
# insert_reservation: new rows only.
_INSERT_HEADER = sa_insert(reservations)
PG_INSERT_HEADER = (
    'INSERT INTO reservations (id, "partition", "key", request_hash, state, queue, user_name,'
    ' "groups", application, priority_class, created_at, expires_at, resolved_at, kube)'
    " VALUES (%(id)s, %(partition)s, %(key)s, %(request_hash)s, %(state)s, %(queue)s,"
    " %(user_name)s, %(groups)s, %(application)s, %(priority_class)s, %(created_at)s,"
    " %(expires_at)s, NULL, %(kube)s)"
)
_INSERT_ITEMS = sa_insert(reservation_items)
PG_INSERT_ITEMS = (
    "INSERT INTO reservation_items (reservation_id, resource, amount)"
    " SELECT %(rid)s, t.resource, t.amount"
    " FROM unnest(%(resources)s::text[], %(amounts)s::bigint[]) AS t(resource, amount)"
)
# resolve_reservation: conditional state change on a row we hold; rowcount tells if it applied.
_RESOLVE = (
    update(reservations)
    .where(_R.id == bindparam("rid"), _R.state == "pending")
    .values(state=bindparam("new_state"), resolved_at=bindparam("now"))
)
PG_RESOLVE = (
    "UPDATE reservations SET state = %(new_state)s, resolved_at = %(now)s"
    " WHERE id = %(rid)s AND state = 'pending'"
)
# expire_reservations: reservation rows this transaction holds.
_EXPIRE_MANY = (
    update(reservations)
    .where(_R.id.in_(bindparam("ids", expanding=True)), _R.state == "pending")
    .values(state="expired", resolved_at=bindparam("now"))
)
PG_EXPIRE_MANY = (
    "UPDATE reservations SET state = 'expired', resolved_at = %(now)s"
    " WHERE id = ANY(%(ids)s) AND state = 'pending'"
)
# record_commits for a full commit: every item committed in full, one statement.
_COMMIT_ALL_ITEMS = (
    update(reservation_items).where(_I.reservation_id == bindparam("rid")).values(committed=_I.amount)
)
PG_COMMIT_ALL_ITEMS = "UPDATE reservation_items SET committed = amount WHERE reservation_id = %(rid)s"
# lock_reservations: locks many reservation header rows in id order (step 3) and reads the clock;
# on PostgreSQL the rows are read by a second statement, after the lock (as lock_reservation).
_LOCK_MANY_IDS = (
    select(_R.id, dialect.utcnow().label("db_now"))
    .where(_R.id.in_(bindparam("ids", expanding=True)))
    .order_by(_R.id)
    .with_for_update()
)
_LOCK_MANY = (
    select(*_HEADER, *_ITEM, dialect.utcnow().label("db_now"))
    .select_from(_JOINED)
    .where(_R.id.in_(bindparam("ids", expanding=True)))
    .order_by(_R.id)
    .with_for_update(of=reservations)
)
# commit_reservations: reservation rows this transaction holds, and their items.
_COMMIT_MANY = (
    update(reservations)
    .where(_R.id.in_(bindparam("ids", expanding=True)), _R.state == "pending")
    .values(state="committed", resolved_at=bindparam("now"))
)
_COMMIT_ALL_ITEMS_OF = (
    update(reservation_items)
    .where(_I.reservation_id.in_(bindparam("ids", expanding=True)))
    .values(committed=_I.amount)
)
PG_COMMIT_MANY = (
    "UPDATE reservations SET state = 'committed', resolved_at = %(now)s"
    " WHERE id = ANY(%(ids)s) AND state = 'pending'"
)
PG_COMMIT_ALL_ITEMS_OF = "UPDATE reservation_items SET committed = amount WHERE reservation_id = ANY(%(ids)s)"
# record_commits for a partial commit: one row per item, of a reservation this transaction holds.
_SET_COMMITTED = (
    update(reservation_items)
    .where(_I.reservation_id == bindparam("rid"), _I.resource == bindparam("res"))
    .values(committed=bindparam("v_committed"))
)

# -- live reservations (what ResourceQuota counters are the sum of) ---------------------------
_LIVE_WHERE = (
    _R.partition == bindparam("p"),
    _R.queue.in_(bindparam("queues", expanding=True)),
    or_(_R.state == "pending", and_(_R.state == "committed", _R.released_at.is_(None))),
)
# read_live_reservations: pending and unreleased committed reservations of some queues; no lock.
_READ_LIVE = select(_R.id, _R.queue, _R.kube).where(*_LIVE_WHERE).order_by(_R.id)
# lock_live_reservations: the same, locked (quota changes, step 3: reservation rows).
_LOCK_LIVE = _READ_LIVE.with_for_update()
# mark_released: a committed reservation this transaction holds.
_MARK_RELEASED = (
    update(reservations)
    .where(_R.id == bindparam("rid"), _R.state == "committed", _R.released_at.is_(None))
    .values(released_at=bindparam("now"))
)


class ReservationStatements:
    """The statements above, as methods of :class:`~quota_ledger.driver.tx.LedgerTx`."""

    conn: Connection
    backend: str
    pg: PgCursor | None
    deferred: list[inline.Statement] | None

    def find_reservation_by_key(self, partition: str, key: str) -> StoredReservation | None:
        params = {"p": partition, "key": key}
        if self.pg is not None:
            return one_stored(self.pg.all(PG_FIND_BY_KEY, params))
        return one_stored(self.conn.execute(_FIND_BY_KEY, params).all())

    def find_reservation(self, reservation_id: str) -> StoredReservation | None:
        return one_stored(self.conn.execute(_FIND_BY_ID, {"id": reservation_id}).all())

    def find_reservations(self, ids: Sequence[str]) -> list[StoredReservation]:
        """The reservations of ``ids`` that exist, in no order, in one statement; no lock."""
        return read_many(self.conn, ids)

    def lock_reservation(self, reservation_id: str) -> tuple[StoredReservation, datetime] | None:
        """Lock one reservation row and read the clock."""
        params = {"id": reservation_id}
        if self.pg is not None:
            # one round trip; the read runs after the lock, with a snapshot of its own
            lock, rows = self.pg.pipelined([Call(PG_LOCK_BY_ID, params), Call(PG_READ_BY_ID, params)])
            stored = one_stored(rows)
            return None if stored is None or not lock else (stored, lock[0].db_now)
        found = self.conn.execute(_LOCK_BY_ID, params).all()
        stored = one_stored(found)
        return None if stored is None else (stored, found[0].db_now)

    def lock_expired(self, partition: str, limit: int, now: datetime) -> list[StoredReservation]:
        """Lock up to ``limit`` pending reservations expired at ``now`` that nobody else holds."""
        params = {"p": partition, "n": limit, "now": now}
        if self.pg is not None:
            return _many(self.pg.all(PG_LOCK_EXPIRED, params))
        if self.backend in ("mysql", "mariadb"):
            candidates = list(self.conn.execute(_EXPIRED_IDS, params).scalars())
            ids = candidates and list(self.conn.execute(_LOCK_IDS_IF_PENDING, {"ids": candidates}).scalars())
        else:
            ids = list(self.conn.execute(_LOCK_EXPIRED_IDS, params).scalars())
        if not ids:
            return []
        return _many(self.conn.execute(_READ_MANY, {"ids": ids}).all())

    def insert_reservation(
        self, reservation: Reservation, request_hash: str, kube: Mapping[str, Any] | None = None
    ) -> None:
        header = header_row(reservation, request_hash, kube)
        if self.pg is not None:
            self.pg.run(PG_INSERT_HEADER, header)
            if reservation.resources:
                items = {
                    "rid": reservation.id,
                    "resources": list(reservation.resources),
                    "amounts": list(reservation.resources.values()),
                }
                self.pg.run(PG_INSERT_ITEMS, items)
            return
        self.conn.execute(_INSERT_HEADER, header)
        if reservation.resources:
            self.conn.execute(_INSERT_ITEMS, _items(reservation))

    def insert_reservations(self, new: Sequence[tuple[Reservation, str, Mapping[str, Any] | None]]) -> None:
        """Insert many new reservations (reservation, request hash, kube) with their items:
        one multi-row insert of the headers and one of the items (MariaDB, SQLite)."""
        if not new:
            return
        headers = [header_row(r, request_hash, kube) for r, request_hash, kube in new]
        statements = [inline.insert_rows(self.conn, reservations, headers)]
        if items := [item for r, _, _ in new for item in _items(r)]:
            statements.append(inline.insert_rows(self.conn, reservation_items, items))
        inline.write(self.conn, self.deferred, statements)

    def lock_reservations(self, ids: Iterable[str]) -> tuple[list[StoredReservation], datetime | None]:
        """Lock many reservation rows (MariaDB, SQLite), in id order, and read the clock (None
        when none was found); ids that are not found are missing from the result."""
        wanted = sorted(set(ids))
        if not wanted:
            return [], None
        params = {"ids": wanted}
        if self.backend == "postgresql":
            locked = self.conn.execute(_LOCK_MANY_IDS, params).all()
            found = self.conn.execute(_READ_MANY, {"ids": [row.id for row in locked]}).all() if locked else []
            return _many(found), locked[0].db_now if locked else None
        rows = self.conn.execute(_LOCK_MANY, params).all()
        return _many(rows), rows[0].db_now if rows else None

    def commit_reservations(self, ids: Sequence[str], now: datetime) -> int:
        """``pending -> committed`` of reservations this transaction holds, every item committed
        in full; how many were pending. One reservation takes the statements of one row (no
        list to expand)."""
        if len(ids) == 1:
            pending = self.resolve_reservation(ids[0], ReservationState.COMMITTED, now)
            self.record_commits(ids[0], {}, whole=True)
            return int(pending)
        params = {"ids": list(ids), "now": now}
        if self.pg is not None:
            changed = self.pg.run(PG_COMMIT_MANY, params).rowcount
            self.pg.run(PG_COMMIT_ALL_ITEMS_OF, params)
            return changed
        changed = self.conn.execute(_COMMIT_MANY, params).rowcount
        self.conn.execute(_COMMIT_ALL_ITEMS_OF, params)
        return changed

    def resolve_reservation(self, reservation_id: str, state: ReservationState, now: datetime) -> bool:
        """``pending -> state`` as a conditional update; False if it was no longer pending."""
        params = {"rid": reservation_id, "new_state": state.value, "now": now}
        if self.pg is not None:
            return self.pg.run(PG_RESOLVE, params).rowcount == 1
        return self.conn.execute(_RESOLVE, params).rowcount == 1

    def record_commits(self, reservation_id: str, committed: Mapping[str, int], *, whole: bool) -> None:
        """Record what each item committed (``whole``: everything that was reserved)."""
        if whole:
            if self.pg is not None:
                self.pg.run(PG_COMMIT_ALL_ITEMS, {"rid": reservation_id})
            else:
                self.conn.execute(_COMMIT_ALL_ITEMS, {"rid": reservation_id})
            return
        self.conn.execute(
            _SET_COMMITTED,
            [{"rid": reservation_id, "res": res, "v_committed": amount} for res, amount in committed.items()],
        )

    def expire_reservations(self, ids: Sequence[str], now: datetime) -> int:
        params = {"ids": list(ids), "now": now}
        if self.pg is not None:
            return self.pg.run(PG_EXPIRE_MANY, params).rowcount
        return self.conn.execute(_EXPIRE_MANY, params).rowcount

    def live_reservations(
        self, partition: str, queues: Iterable[str], *, lock: bool
    ) -> list[tuple[str, str, dict[str, Any] | None]]:
        """(id, queue, kube) of every pending or unreleased committed reservation in ``queues``."""
        queue_list = sorted(set(queues))
        if not queue_list:
            return []
        rows = self.conn.execute(_LOCK_LIVE if lock else _READ_LIVE, {"p": partition, "queues": queue_list})
        return [(row.id, row.queue, json.loads(row.kube) if row.kube else None) for row in rows]

    def mark_released(self, reservation_id: str, now: datetime) -> bool:
        return self.conn.execute(_MARK_RELEASED, {"rid": reservation_id, "now": now}).rowcount == 1


def header_row(reservation: Reservation, request_hash: str, kube: Mapping[str, Any] | None) -> dict[str, Any]:
    """A new reservation's row of ``reservations``, as inserted."""
    return {
        "id": reservation.id,
        "partition": reservation.partition,
        "key": reservation.key,
        "request_hash": request_hash,
        "state": reservation.state.value,
        "queue": reservation.queue,
        "user_name": reservation.user,
        "groups": json.dumps(list(reservation.groups)) if reservation.groups else None,
        "application": reservation.application,
        "priority_class": reservation.priority_class,
        "created_at": dialect.naive(reservation.created_at),
        "expires_at": dialect.naive(reservation.expires_at),
        "resolved_at": None,
        "kube": None if kube is None else json.dumps(kube, sort_keys=True, separators=(",", ":")),
        "released_at": None,
    }


def _items(reservation: Reservation) -> list[dict[str, Any]]:
    return [
        {"reservation_id": reservation.id, "resource": res, "amount": amount, "committed": None}
        for res, amount in reservation.resources.items()
    ]


def read_many(conn: Connection, ids: Sequence[str]) -> list[StoredReservation]:
    """The reservations of ``ids`` that exist, in no order; no lock."""
    return _many(conn.execute(_READ_MANY, {"ids": list(ids)}).all()) if ids else []


def _many(rows: Sequence[Any]) -> list[StoredReservation]:
    grouped: dict[str, list[Any]] = {}
    for row in rows:
        grouped.setdefault(row.id, []).append(row)
    return [_build(group) for group in grouped.values()]


def one_stored(rows: Sequence[Any]) -> StoredReservation | None:
    return _build(list(rows)) if rows else None


def _build(rows: list[Any]) -> StoredReservation:
    head = rows[0]
    items = [row for row in rows if row.resource is not None]
    state = ReservationState(head.state)
    committed = (
        {row.resource: row.committed or 0 for row in items} if state is ReservationState.COMMITTED else None
    )
    reservation = Reservation(
        id=head.id,
        state=state,
        partition=head.partition,
        queue=head.queue,
        resources={row.resource: row.amount for row in sorted(items, key=lambda r: r.resource)},
        created_at=dialect.aware(head.created_at),
        expires_at=dialect.aware(head.expires_at),
        key=head.key,
        user=head.user_name,
        groups=tuple(json.loads(head.groups)) if head.groups else (),
        application=head.application,
        priority_class=head.priority_class,
        committed=committed,
        resolved_at=dialect.aware(head.resolved_at) if head.resolved_at is not None else None,
        released_at=dialect.aware(head.released_at) if head.released_at is not None else None,
        priority=head.priority,
    )
    kube = json.loads(head.kube) if head.kube else None
    return StoredReservation(reservation=reservation, request_hash=head.request_hash, kube=kube)
