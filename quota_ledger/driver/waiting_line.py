"""The waiting line: reservations in state ``waiting``, ordered by ``priority`` (higher first),
``queued_at`` (arrival) and ``id``. A waiting row holds nothing: no counter counts it. Its
``expires_at`` is when its wait runs out, and ``ttl_ms`` the ttl its grant starts (the grant
clears it). Rows are locked as reservation rows are (step 3 of the lock order in :mod:`.tx`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Integer, String, and_, bindparam, func, literal_column, or_, select, update
from sqlalchemy import insert as sa_insert

from quota_ledger.driver import dialect, line_notices
from quota_ledger.driver.pg_cursor import PgCursor
from quota_ledger.driver.reservations import PG_HEADER, header_row, one_stored, read_many
from quota_ledger.driver.schema import quota_config_head, reservation_items, reservations
from quota_ledger.model import line as lines
from quota_ledger.model.values import Reservation, StoredReservation, Violation

_R = reservations.c
_I = reservation_items.c
#: written into the statements, not bound: only then can the planner use the partial line index
_WAITING = literal_column("'waiting'", String)
_IN_LINE = (_R.partition == bindparam("p"), _R.state == _WAITING)
_ORDER = (_R.priority.desc(), _R.queued_at, _R.id)

# line: the ids of a partition's line, in grant order; no lock.
_LINE = select(_R.id).where(*_IN_LINE).order_by(*_ORDER).limit(bindparam("n", type_=Integer))
# line_rows: the same with what each needs, for views; no lock.
_FIRST = select(_R.id).where(*_IN_LINE).order_by(*_ORDER).limit(bindparam("n", type_=Integer)).subquery()
_LINE_ROWS = (
    select(
        _R.id,
        _R.key,
        _R.queue,
        _R.user_name,
        _R.groups,
        _R.application,
        _R.priority_class,
        _R.kube,
        _R.priority,
        _R.queued_at,
        _R.expires_at,
        _R.ttl_ms,
        _I.resource,
        _I.amount,
    )
    .select_from(
        _FIRST.join(reservations, _R.id == _FIRST.c.id).outerjoin(
            reservation_items, _I.reservation_id == _R.id
        )
    )
    .order_by(*_ORDER, _I.resource)
)
# run_out: waiting rows whose wait has run out at :now; no lock.
_RUN_OUT = (
    select(_R.id)
    .where(*_IN_LINE, _R.expires_at <= bindparam("now"))
    .order_by(_R.expires_at)
    .limit(bindparam("n", type_=Integer))
)
# insert_waiting on PostgreSQL: a new waiting row and its items, in one statement.
_PG_INSERT_WAITING = (
    'WITH head AS (INSERT INTO reservations (id, "partition", "key", request_hash, state, queue, user_name,'
    ' "groups", application, priority_class, created_at, expires_at, resolved_at, kube, released_at,'
    " priority, queued_at, ttl_ms, blocked_by)"
    " VALUES (%(id)s, %(partition)s, %(key)s, %(request_hash)s, %(state)s, %(queue)s, %(user_name)s,"
    " %(groups)s, %(application)s, %(priority_class)s, %(created_at)s, %(expires_at)s, NULL, %(kube)s,"
    " NULL, %(priority)s, %(queued_at)s, %(ttl_ms)s, %(blocked_by)s) RETURNING id)"
    " INSERT INTO reservation_items (reservation_id, resource, amount)"
    " SELECT head.id, t.resource, t.amount"
    " FROM head, unnest(%(resources)s::text[], %(amounts)s::bigint[]) AS t(resource, amount)"
)
# entry: a row's place in line; no lock.
_ENTRY = select(_R.priority, _R.queued_at, _R.ttl_ms, _R.blocked_by).where(_R.id == bindparam("id"))
# blocked: what stopped a row this transaction holds when it was last tried.
_BLOCKED = (
    update(reservations)
    .where(_R.id == bindparam("rid"), _R.state == "waiting")
    .values(blocked_by=bindparam("blocked"))
)
# ahead: how many waiting rows of the partition come before (:pr, :at, :id) in grant order.
_BEFORE = or_(
    _R.priority > bindparam("pr"),
    and_(
        _R.priority == bindparam("pr"),
        or_(_R.queued_at < bindparam("at"), and_(_R.queued_at == bindparam("at"), _R.id < bindparam("id"))),
    ),
)
_AHEAD = select(func.count()).where(*_IN_LINE, _BEFORE)
_WITH_ITEMS = reservations.outerjoin(reservation_items, _I.reservation_id == _R.id)
# ahead_rows: the waiting rows of a partition before (:pr, :at, :id), with their items; no lock.
_AHEAD_ROWS = (
    select(_R.id, _R.queue, _R.blocked_by, _I.resource, _I.amount)
    .select_from(_WITH_ITEMS)
    .where(*_IN_LINE, _BEFORE, _R.expires_at > dialect.utcnow())
    .order_by(*_ORDER)
)
# ahead_rows of a request not in line yet: every waiting row of its priority or higher.
_AT_LEAST_ROWS = (
    select(_R.id, _R.queue, _R.blocked_by, _I.resource, _I.amount)
    .select_from(_WITH_ITEMS)
    .where(*_IN_LINE, _R.priority >= bindparam("pr"), _R.expires_at > dialect.utcnow())
    .order_by(*_ORDER)
)
# queue_lines: per queue of a partition, its waiting requests and when the first joined; no lock.
_QUEUE_LINES = (
    select(_R.queue, func.count().label("n"), func.min(_R.queued_at).label("oldest"))
    .where(*_IN_LINE)
    .group_by(_R.queue)
    .order_by(_R.queue)
)
# last_queued: when the request that joined a partition's line last joined; no lock.
_LAST_QUEUED = select(func.max(_R.queued_at)).where(*_IN_LINE)
# clock_last_and_version: the same, with the configuration version in force; no lock.
_CLOCK_LAST_AND_VERSION = select(
    dialect.utcnow().label("db_now"),
    func.max(_R.queued_at).label("last"),
    select(quota_config_head.c.version).where(quota_config_head.c.id == 1).scalar_subquery().label("version"),
).where(*_IN_LINE)
# clock_and_last_queued: the database clock, and the same; no lock.
_CLOCK_AND_LAST_QUEUED = select(dialect.utcnow().label("db_now"), func.max(_R.queued_at).label("last")).where(
    *_IN_LINE
)
# malformed: waiting rows that are not what a waiting request is (no place in line, no ttl for
# its grant, or an item that says it was committed); no lock.
_MALFORMED = (
    select(_R.id, _R.queue)
    .where(
        *_IN_LINE,
        or_(
            _R.queued_at.is_(None),
            _R.ttl_ms.is_(None),
            _R.id.in_(select(_I.reservation_id).where(_I.committed.is_not(None))),
        ),
    )
    .order_by(_R.id)
)
# has_line: whether a partition has a line; no lock.
_HAS_LINE = select(_R.id).where(*_IN_LINE).limit(1)
# grant: waiting -> pending, made now; a row this transaction holds.
_GRANT = (
    update(reservations)
    .where(_R.id == bindparam("rid"), _R.state == "waiting")
    .values(created_at=bindparam("now"), expires_at=bindparam("expires"), state="pending", ttl_ms=None)
)
# leave: waiting -> rolled_back or expired; rows this transaction holds.
_LEAVE = (
    update(reservations)
    .where(_R.id.in_(bindparam("ids", expanding=True)), _R.state == "waiting")
    .values(state=bindparam("new_state"), resolved_at=bindparam("now"))
)


# lock_line_head: locks the first row of a partition's line (step 3), unless another
# transaction holds it (then nothing: that one decides it) or it left the line meanwhile, and
# reads it with its items and the clock. Its items never change while it waits, so the
# statement's snapshot reads them right. When it finds the row, the transaction's later lock
# waits end after :ms (set_config(..., true) is SET LOCAL). PostgreSQL.
_PG_LOCK_HEAD = (
    f"SELECT {PG_HEADER}, r.queued_at, r.ttl_ms, r.blocked_by,"  # noqa: S608 - constants only
    " TIMEZONE('UTC', clock_timestamp()) AS db_now, set_config('lock_timeout', %(ms)s, true) AS bound"
    " FROM (SELECT id FROM reservations WHERE state = 'waiting' AND id = ("
    "SELECT id FROM reservations WHERE \"partition\" = %(p)s AND state = 'waiting'"
    " ORDER BY priority DESC, queued_at, id LIMIT 1) FOR UPDATE SKIP LOCKED) h"
    " JOIN reservations r ON r.id = h.id LEFT JOIN reservation_items i ON i.reservation_id = r.id"
)


@dataclass(frozen=True, slots=True)
class Entry:
    """A waiting row's place in line, the ttl its grant starts, and what stopped it last."""

    priority: int
    queued_at: datetime
    ttl_ms: int | None
    blocked: tuple[Violation, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Waiting:
    """One request of a line, as :meth:`WaitingStatements.line_rows` reads it."""

    id: str
    partition: str
    queue: str
    user: str | None
    #: the groups column as stored (JSON), compared as it is
    groups: str | None
    application: str | None
    priority_class: str | None
    #: the Kubernetes scope attributes ResourceQuotas match on (JSON), compared as they are
    scopes: str | None
    priority: int
    queued_at: datetime
    #: when its wait runs out
    until: datetime
    #: resource -> amount
    needs: dict[str, int]
    #: its idempotency key, the ttl its grant starts (ms), and its ``kube`` column as stored
    key: str | None = None
    ttl_ms: int | None = None
    kube: str | None = None


class WaitingStatements:
    """The statements above, as methods of :class:`~quota_ledger.driver.tx.LedgerTx`."""

    conn: Connection
    pg: PgCursor | None

    def insert_waiting(
        self,
        reservation: Reservation,
        request_hash: str,
        kube: Mapping[str, Any] | None,
        ttl_ms: int,
        blocked: Sequence[Violation] = (),
    ) -> None:
        """A new row in the line: ``reservation`` (state ``waiting``, created when it joins,
        ``expires_at`` when its wait runs out) and its items."""
        row = header_row(reservation, request_hash, kube)
        row.update(
            priority=reservation.priority,
            queued_at=dialect.naive(reservation.created_at),
            ttl_ms=ttl_ms,
            blocked_by=_blocked_json(blocked),
        )
        if self.pg is not None:  # one statement: the row, then its items
            items = {
                "resources": list(reservation.resources),
                "amounts": list(reservation.resources.values()),
            }
            self.pg.run(_PG_INSERT_WAITING, {**row, **items})
            return
        self.conn.execute(sa_insert(reservations), row)
        if reservation.resources:
            self.conn.execute(
                sa_insert(reservation_items),
                [
                    {"reservation_id": reservation.id, "resource": res, "amount": n, "committed": None}
                    for res, n in reservation.resources.items()
                ],
            )

    def line(self, partition: str, limit: int) -> list[str]:
        """The ids of the first ``limit`` requests of ``partition``'s line, in grant order."""
        return list(self.conn.execute(_LINE, {"p": partition, "n": limit}).scalars())

    def line_reservations(self, partition: str, limit: int) -> list[Reservation]:
        """The first ``limit`` requests of ``partition``'s line, in grant order, each with its
        ``position``."""
        ids = self.line(partition, limit)
        found = {s.reservation.id: s.reservation for s in read_many(self.conn, ids)}
        return [dataclasses.replace(found[rid], position=n) for n, rid in enumerate(ids, 1) if rid in found]

    def line_rows(self, partition: str, limit: int) -> list[Waiting]:
        """The first ``limit`` requests of ``partition``'s line in grant order, with what each
        needs."""
        found: dict[str, Waiting] = {}
        for row in self.conn.execute(_LINE_ROWS, {"p": partition, "n": limit}):
            each = found.get(row.id)
            if each is None:
                each = found[row.id] = Waiting(
                    id=row.id,
                    partition=partition,
                    queue=row.queue,
                    user=row.user_name,
                    groups=row.groups,
                    application=row.application,
                    priority_class=row.priority_class,
                    scopes=_scopes(row.kube),
                    priority=row.priority,
                    queued_at=dialect.aware(row.queued_at),
                    until=dialect.aware(row.expires_at),
                    needs={},
                    key=row.key,
                    ttl_ms=row.ttl_ms,
                    kube=row.kube,
                )
            if row.resource is not None:
                each.needs[row.resource] = row.amount
        return list(found.values())

    def waits_run_out(self, partition: str, now: datetime, limit: int) -> list[str]:
        """Up to ``limit`` ids of ``partition``'s waiting rows whose wait ran out by ``now``."""
        return list(self.conn.execute(_RUN_OUT, {"p": partition, "now": now, "n": limit}).scalars())

    def lock_line_head(
        self, partition: str, lock_wait: float
    ) -> tuple[StoredReservation, Entry, datetime] | None:
        """Lock the first request of ``partition``'s line and read it, its place in line and
        the clock (PostgreSQL); None when no request waits, or another transaction holds the
        first (it decides it). Found, the transaction's later lock waits end after
        ``lock_wait`` seconds: a wait past it fails the attempt as a conflict, and the driver
        runs it again."""
        assert self.pg is not None
        params = {"p": partition, "ms": f"{max(1, round(lock_wait * 1000))}ms"}
        rows = self.pg.all(_PG_LOCK_HEAD, params)
        stored = one_stored(rows)
        if stored is None:
            return None
        return stored, _entry(rows[0]), rows[0].db_now

    def line_entry(self, reservation_id: str) -> Entry | None:
        """A row's place in line (None: no such row)."""
        row = self.conn.execute(_ENTRY, {"id": reservation_id}).one_or_none()
        if row is None or row.queued_at is None:
            return None
        return _entry(row)

    def set_blocked(self, reservation_id: str, blocked: Sequence[Violation]) -> None:
        """Record what stopped a waiting row this transaction holds."""
        params = {"rid": reservation_id, "blocked": _blocked_json(blocked)}
        self.conn.execute(_BLOCKED, params)

    def line_ahead(
        self, partition: str, priority: int, place: tuple[datetime, str] | None
    ) -> list[lines.Ahead]:
        """The waiting requests of ``partition`` ahead of a request of ``priority`` in grant
        order: of one in line at ``place`` (queued at, id), or of one not in line yet."""
        if place is None:
            rows = self.conn.execute(_AT_LEAST_ROWS, {"p": partition, "pr": priority})
        else:
            params = {"p": partition, "pr": priority, "at": dialect.naive(place[0]), "id": place[1]}
            rows = self.conn.execute(_AHEAD_ROWS, params)
        found: dict[str, tuple[str, str | None, dict[str, int]]] = {}
        for row in rows:
            each = found.setdefault(row.id, (row.queue, row.blocked_by, {}))
            if row.resource is not None:
                each[2][row.resource] = row.amount
        return [
            lines.Ahead(queue=q, needs=needs, blocked=lines.from_json(json.loads(b)) if b else ())
            for q, b, needs in found.values()
        ]

    def ahead_of(self, partition: str, reservation_id: str, entry: Entry) -> int:
        """How many waiting requests of ``partition`` come before this one in grant order."""
        params = {
            "p": partition,
            "pr": entry.priority,
            "at": dialect.naive(entry.queued_at),
            "id": reservation_id,
        }
        return int(self.conn.execute(_AHEAD, params).scalar_one())

    def queue_lines(self, partition: str) -> list[tuple[str, int, datetime]]:
        """(queue, waiting requests, when the first of them joined) of ``partition``'s line."""
        return [
            (row.queue, row.n, dialect.aware(row.oldest))
            for row in self.conn.execute(_QUEUE_LINES, {"p": partition})
        ]

    def last_queued(self, partition: str) -> datetime | None:
        """When the latest of ``partition``'s waiting requests joined its line (None: no line)."""
        found = self.conn.execute(_LAST_QUEUED, {"p": partition}).scalar()
        return None if found is None else dialect.aware(found)

    def clock_and_last_queued(self, partition: str) -> tuple[datetime, datetime | None]:
        """The database clock, and :meth:`last_queued`, in one statement."""
        row = self.conn.execute(_CLOCK_AND_LAST_QUEUED, {"p": partition}).one()
        return row.db_now, None if row.last is None else dialect.aware(row.last)

    def clock_last_and_version(self, partition: str) -> tuple[datetime, datetime | None, int]:
        """:meth:`clock_and_last_queued`, and the configuration version in force, in one
        statement."""
        row = self.conn.execute(_CLOCK_LAST_AND_VERSION, {"p": partition}).one()
        return row.db_now, None if row.last is None else dialect.aware(row.last), int(row.version)

    def notify_left(self, partition: str, reservation_id: str | None = None) -> None:
        """A request of ``partition`` (``reservation_id``, when one) left its line in this
        transaction: PostgreSQL's listeners hear of it at commit (elsewhere nothing)."""
        line_notices.notify(self.conn, partition, reservation_id)

    def malformed_waits(self, partition: str) -> list[tuple[str, str]]:
        """(id, queue) of ``partition``'s waiting rows that no waiting request can be: without a
        place in line or a ttl for its grant, or with an item committed."""
        return [(row.id, row.queue) for row in self.conn.execute(_MALFORMED, {"p": partition})]

    def has_line(self, partition: str) -> bool:
        """Whether ``partition`` has a waiting request."""
        return self.conn.execute(_HAS_LINE, {"p": partition}).first() is not None

    def grant_waiting(self, reservation_id: str, now: datetime, expires_at: datetime) -> int:
        """``waiting -> pending`` of a row this transaction holds, made at ``now``; 1 if it was
        waiting, else 0."""
        params = {"rid": reservation_id, "now": dialect.naive(now), "expires": dialect.naive(expires_at)}
        return self.conn.execute(_GRANT, params).rowcount

    def leave_line(self, ids: Sequence[str], state: str, now: datetime) -> int:
        """``waiting -> state`` (``rolled_back``, ``expired``) of rows this transaction holds;
        how many were waiting."""
        if not ids:
            return 0
        return self.conn.execute(
            _LEAVE, {"ids": list(ids), "new_state": state, "now": dialect.naive(now)}
        ).rowcount


def _entry(row: Any) -> Entry:
    """The place in line of a row read with its priority, queued_at, ttl_ms and blocked_by."""
    blocked = lines.from_json(json.loads(row.blocked_by)) if row.blocked_by else ()
    return Entry(row.priority, dialect.aware(row.queued_at), row.ttl_ms, blocked)


def _scopes(kube: str | None) -> str | None:
    """The scope attributes of a row's ``kube`` JSON, as canonical JSON."""
    return json.dumps(json.loads(kube).get("scopes"), sort_keys=True) if kube else None


def _blocked_json(blocked: Sequence[Violation]) -> str | None:
    return json.dumps(lines.to_json(blocked), sort_keys=True, separators=(",", ":")) if blocked else None
