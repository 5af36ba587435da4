"""Expiry batches grouped by queue, and the reservation index that finds them.

The expiry function took the oldest expired reservations, one per queue when they were spread
out, and so updated four counters per row. It now takes the queues of the oldest ones and as
many of each queue's expired reservations as fit in the batch: each counter is updated once per
batch, not once per row. ``ix_reservations_partition_queue`` becomes
``(partition, queue, state, expires_at)`` so that a queue's expired reservations are found
without reading its history; every query that used the old index uses its prefix. The function
also updates its locked reservation rows by address and commits without waiting for the WAL
flush. On PostgreSQL and SQLite the pending-expiry index and the key index become partial
(``state = 'pending'``, ``key IS NOT NULL``); MariaDB has no partial indexes and keeps both.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_EXPIRE = """
CREATE OR REPLACE FUNCTION quota_ledger_expire(
    p_partition text, p_limit integer, p_skip_queues text[], p_version integer,
    p_lock_ns integer, p_lock_key integer
) RETURNS integer
LANGUAGE plpgsql
-- A batch's row estimates are guesses: compiling would cost more than running. Every read is
-- by key (see quota_ledger_reserve), so a scan of a whole table is never the better plan.
SET jit = off
SET enable_seqscan = off
AS $$
DECLARE
    v_now timestamp;
    v_ids text[];
    v_rows tid[];
    v_queues text[];
    v_counters tid[];
    v_totals bigint[];
    v_updated integer;
    v_count integer;
BEGIN
    v_now := quota_ledger_enter(p_lock_ns, p_lock_key, p_version);
    -- A batch lost in a crash is swept again (its rows are still pending), and any later
    -- commit that relied on it flushes it first (the WAL is ordered): no need to wait for the
    -- flush, whose wait would hold the sweeper back while the load keeps the disk busy.
    PERFORM set_config('synchronous_commit', 'off', true);
    -- The queues of the oldest expired reservations, oldest first, and as many of the expired
    -- reservations in them as fit: stale reservations pile up per queue (a crashed client
    -- leaks a queue's worth), and a batch grouped by queue updates each counter once.
    SELECT array_agg(b.id), array_agg(b.queue), array_agg(b.ctid) INTO v_ids, v_queues, v_rows
    FROM (SELECT r.id, r.queue, r.ctid
          FROM (SELECT s.queue FROM (
                    SELECT queue, expires_at FROM reservations
                    WHERE "partition" = p_partition AND state = 'pending' AND expires_at <= v_now
                      AND user_name IS NULL AND application IS NULL
                      AND queue <> ALL(p_skip_queues)
                    ORDER BY expires_at LIMIT p_limit) AS s
                GROUP BY s.queue ORDER BY min(s.expires_at)) AS q
          CROSS JOIN LATERAL (
              SELECT id, queue, ctid FROM reservations
              WHERE "partition" = p_partition AND queue = q.queue AND state = 'pending'
                AND expires_at <= v_now AND user_name IS NULL AND application IS NULL
              ORDER BY expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED) AS r
          LIMIT p_limit) AS b;
    v_count := coalesce(cardinality(v_ids), 0);
    IF v_count < p_limit THEN
        -- another sweeper holds some of those: fill up from the rest, oldest first, so that
        -- a short batch still means there is nothing left to sweep
        SELECT v_ids || array_agg(s.id), v_queues || array_agg(s.queue), v_rows || array_agg(s.ctid)
        INTO v_ids, v_queues, v_rows
        FROM (SELECT id, queue, ctid FROM reservations
              WHERE "partition" = p_partition AND state = 'pending' AND expires_at <= v_now
                AND user_name IS NULL AND application IS NULL AND queue <> ALL(p_skip_queues)
                AND id <> ALL(coalesce(v_ids, '{}'))
              ORDER BY expires_at LIMIT p_limit - v_count FOR UPDATE SKIP LOCKED) AS s;
    END IF;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    -- by physical address, as the counters below: the rows are ours until we commit
    UPDATE reservations SET state = 'expired', resolved_at = v_now WHERE ctid = ANY(v_rows);
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_rows);
    WITH sums AS (
        SELECT e.queue, i.resource, sum(i.amount) AS total
        FROM unnest(v_ids, v_queues) AS e(id, queue)
        JOIN reservation_items i ON i.reservation_id = e.id
        WHERE i.reservation_id = ANY(v_ids)  -- an index scan, however long the history is
        GROUP BY e.queue, i.resource
    ), targets AS (
        SELECT 'queue' AS scope_type, s.queue AS scope, s.resource, s.total FROM sums s
        UNION ALL
        SELECT 'subtree', a.scope, s.resource, s.total
        FROM sums s CROSS JOIN LATERAL (
            -- the lineage of s.queue: root, root.a, root.a.b
            SELECT array_to_string(p.parts[1:k], '.') AS scope
            FROM (SELECT string_to_array(s.queue, '.') AS parts) AS p,
                 generate_series(1, cardinality(p.parts)) AS k
        ) AS a
    )
    -- look up and lock the counters key by key in the canonical order: queue counters, then
    -- subtree counters, each by scope and resource (as in quota_ledger_reserve)
    SELECT array_agg(c.ctid), array_agg(c.total) INTO v_counters, v_totals
    FROM (SELECT scope_type, scope, resource, sum(total)::bigint AS total FROM targets
          GROUP BY scope_type, scope, resource
          ORDER BY scope_type = 'subtree', scope COLLATE "C", resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, w.total FROM quota_usages u
        WHERE u."partition" = p_partition AND u.scope_type = w.scope_type AND u.scope = w.scope
          AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    -- by physical address: a row we hold locked cannot move
    UPDATE quota_usages u SET reserved = u.reserved - d.total, updated_at = v_now
    FROM unnest(v_counters, v_totals) AS d(tid, total) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_counters);
    RETURN cardinality(v_ids);
END
$$
"""


def _expire_of_0004() -> str:
    """The function as revision 0004 created it, for the downgrade."""
    spec = importlib.util.spec_from_file_location("ql_0004", Path(__file__).with_name("0004_pg_functions.py"))
    if spec is None or spec.loader is None:
        raise RuntimeError("revision 0004 is missing next to revision 0005")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module._EXPIRE).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


_PENDING = "ix_reservations_partition_state_expires_at"
_KEY = "uq_reservations_partition_key"


def _partial(predicate: str) -> dict[str, sa.TextClause]:
    return {"postgresql_where": sa.text(predicate), "sqlite_where": sa.text(predicate)}


def upgrade() -> None:
    engine = op.get_bind().dialect.name
    op.create_index(
        "ix_reservations_partition_queue_state_expires_at",
        "reservations",
        ["partition", "queue", "state", "expires_at"],
    )
    op.drop_index("ix_reservations_partition_queue", table_name="reservations")
    if engine in ("postgresql", "sqlite"):
        # Partial indexes: a row that leaves 'pending', or has no key, adds no entry to them.
        op.drop_index(_PENDING, table_name="reservations")
        op.create_index(
            _PENDING, "reservations", ["partition", "state", "expires_at"], **_partial("state = 'pending'")
        )
        with op.batch_alter_table("reservations") as batch:
            batch.drop_constraint(_KEY, type_="unique")
        op.create_index(
            _KEY, "reservations", ["partition", "key"], unique=True, **_partial("key IS NOT NULL")
        )
    if engine == "postgresql":
        op.execute(_EXPIRE)


def downgrade() -> None:
    engine = op.get_bind().dialect.name
    if engine == "postgresql":
        op.execute(_expire_of_0004())
    if engine in ("postgresql", "sqlite"):
        op.drop_index(_KEY, table_name="reservations")
        with op.batch_alter_table("reservations") as batch:
            batch.create_unique_constraint(_KEY, ["partition", "key"])
        op.drop_index(_PENDING, table_name="reservations")
        op.create_index(_PENDING, "reservations", ["partition", "state", "expires_at"])
    op.create_index("ix_reservations_partition_queue", "reservations", ["partition", "queue"])
    op.drop_index("ix_reservations_partition_queue_state_expires_at", table_name="reservations")
