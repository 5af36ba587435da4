"""PostgreSQL: the common reserve, commit and expiry transactions as server-side functions.

Each function is one statement, run as its own transaction: no lock is held across a network
round trip, and a reserve+commit pair costs two round trips instead of eighteen. They cover
the plain case only (no user, groups or application, counters that exist, the configuration
version the caller compiled, which also decided the ResourceQuotas to charge) and *decline* everything else by raising SQLSTATE
``QL001`` before any change survives; the driver then runs the general Python path, which
remains the one source of truth for refusals and errors. Lock order is the canonical one:
partition (advisory, shared) -> reservation rows -> queue counters -> subtree counters.

MariaDB and SQLite get nothing here.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_LINEAGE = """
CREATE FUNCTION quota_ledger_lineage(p_queue text) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    -- 'root.a.b' -> {root, root.a, root.a.b}
    SELECT array_agg(array_to_string(parts[1:k], '.') ORDER BY k)
    FROM (SELECT string_to_array(p_queue, '.') AS parts) s,
         generate_series(1, cardinality(parts)) AS k
$$
"""

_RESERVE = """
CREATE FUNCTION quota_ledger_reserve(
    p_id text, p_partition text, p_key text, p_request_hash text, p_queue text,
    p_resources text[], p_amounts bigint[], p_ttl_us bigint, p_priority_class text, p_kube text,
    p_version integer, p_lock_ns integer, p_lock_key integer,
    -- the ResourceQuota counters the request is charged to: (namespace/name, resource, amount)
    p_quota_names text[], p_quota_resources text[], p_quota_amounts bigint[]
) RETURNS timestamp
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamp;
    v_version integer;
    v_scopes text[] := quota_ledger_lineage(p_queue);
    v_count integer;
    v_broken integer;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_lock_ns, p_lock_key);
    v_now := TIMEZONE('UTC', clock_timestamp());
    SELECT version INTO v_version FROM quota_config_head WHERE id = 1;
    IF v_version IS DISTINCT FROM p_version THEN
        RAISE EXCEPTION 'configuration changed' USING ERRCODE = 'QL001';
    END IF;
    -- our own new rows first (a same-key insert in flight makes us wait for it)
    INSERT INTO reservations (id, "partition", "key", request_hash, state, queue, user_name, "groups",
                              application, priority_class, created_at, expires_at, resolved_at, kube)
    VALUES (p_id, p_partition, p_key, p_request_hash, 'pending', p_queue, NULL, NULL, NULL,
            p_priority_class, v_now, v_now + p_ttl_us * interval '1 microsecond', NULL, p_kube)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'reservation id or key exists' USING ERRCODE = 'QL001';
    END IF;
    INSERT INTO reservation_items (reservation_id, resource, amount)
    SELECT p_id, t.resource, t.amount FROM unnest(p_resources, p_amounts) AS t(resource, amount);
    -- the queue's own counters, then the limits on its lineage, each in canonical order
    SELECT count(*), count(*) FILTER (WHERE c.in_use::numeric + c.reserved + c.amount > 9223372036854775807)
    INTO v_count, v_broken
    FROM (SELECT u.in_use, u.reserved, t.amount FROM quota_usages u
          JOIN unnest(p_resources, p_amounts) AS t(resource, amount) ON u.resource = t.resource
          WHERE u."partition" = p_partition AND u.scope_type = 'queue' AND u.scope = p_queue
          ORDER BY u.scope, u.resource FOR UPDATE OF u) AS c;
    IF v_count < cardinality(p_resources) OR v_broken > 0 THEN
        RAISE EXCEPTION 'counters missing or at the bigint limit' USING ERRCODE = 'QL001';
    END IF;
    SELECT count(*) FILTER (WHERE c.in_use::numeric + c.reserved + c.amount
                                  > coalesce(c.hard_limit, 9223372036854775807))
    INTO v_broken
    FROM (SELECT u.in_use, u.reserved, u.hard_limit, t.amount FROM quota_usages u
          JOIN unnest(p_resources, p_amounts) AS t(resource, amount) ON u.resource = t.resource
          WHERE u."partition" = p_partition AND u.scope_type = 'subtree' AND u.scope = ANY(v_scopes)
          ORDER BY u.scope, u.resource FOR UPDATE OF u) AS c;
    IF v_broken > 0 THEN
        RAISE EXCEPTION 'over a limit' USING ERRCODE = 'QL001';
    END IF;
    -- then the ResourceQuota counters, by (kind, name, queue, resource); a quota counts the
    -- live reservations it matches in in_use, from reserve on
    IF cardinality(p_quota_names) > 0 THEN
        SELECT count(*), count(*) FILTER (WHERE c.in_use::numeric + c.reserved + c.amount > c.hard_limit)
        INTO v_count, v_broken
        FROM (SELECT u.in_use, u.reserved, u.hard_limit, t.amount FROM quota_identity_usages u
              JOIN unnest(p_quota_names, p_quota_resources, p_quota_amounts) AS t(name, resource, amount)
                ON u.name = t.name AND u.resource = t.resource
              WHERE u."partition" = p_partition AND u.kind = 'quota' AND u.queue = p_queue
              ORDER BY u.kind, u.name, u.queue, u.resource FOR UPDATE OF u) AS c;
        IF v_count < cardinality(p_quota_names) OR v_broken > 0 THEN
            RAISE EXCEPTION 'a ResourceQuota counter is missing or full' USING ERRCODE = 'QL001';
        END IF;
    END IF;
    UPDATE quota_usages u SET reserved = u.reserved + t.amount, updated_at = v_now
    FROM unnest(p_resources, p_amounts) AS t(resource, amount)
    WHERE u."partition" = p_partition AND u.resource = t.resource
      AND ((u.scope_type = 'queue' AND u.scope = p_queue)
           OR (u.scope_type = 'subtree' AND u.scope = ANY(v_scopes)));
    IF cardinality(p_quota_names) > 0 THEN
        UPDATE quota_identity_usages u SET in_use = u.in_use + t.amount, updated_at = v_now
        FROM unnest(p_quota_names, p_quota_resources, p_quota_amounts) AS t(name, resource, amount)
        WHERE u."partition" = p_partition AND u.kind = 'quota' AND u.queue = p_queue
          AND u.name = t.name AND u.resource = t.resource;
    END IF;
    RETURN v_now;
END
$$
"""

_COMMIT = """
CREATE FUNCTION quota_ledger_commit(p_id text, p_operation_id text)
RETURNS TABLE ("partition" text, "key" text, queue text, priority_class text,
               created_at timestamp, expires_at timestamp, resolved_at timestamp,
               resources text[], amounts bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    r reservations%ROWTYPE;
    v_now timestamp;
    v_resources text[];
    v_amounts bigint[];
    v_scopes text[];
    v_broken integer;
BEGIN
    SELECT * INTO r FROM reservations WHERE id = p_id FOR UPDATE;
    v_now := TIMEZONE('UTC', clock_timestamp());
    IF NOT FOUND OR r.state <> 'pending' OR v_now >= r.expires_at
       OR r.user_name IS NOT NULL OR r.application IS NOT NULL THEN
        RAISE EXCEPTION 'not a plain pending reservation' USING ERRCODE = 'QL001';
    END IF;
    SELECT array_agg(i.resource ORDER BY i.resource), array_agg(i.amount ORDER BY i.resource)
    INTO v_resources, v_amounts FROM reservation_items i WHERE i.reservation_id = p_id;
    IF v_resources IS NULL THEN
        RAISE EXCEPTION 'nothing reserved' USING ERRCODE = 'QL001';
    END IF;
    v_scopes := quota_ledger_lineage(r.queue);
    UPDATE reservations SET state = 'committed', resolved_at = v_now WHERE id = p_id;
    UPDATE reservation_items SET committed = amount WHERE reservation_id = p_id;
    INSERT INTO quota_journal ("partition", queue, resource, delta, kind, reservation_id, operation_id,
                               created_at)
    SELECT r."partition", r.queue, t.resource, t.amount, 'commit', p_id, p_operation_id, v_now
    FROM unnest(v_resources, v_amounts) AS t(resource, amount);
    SELECT count(*) FILTER (WHERE c.in_use::numeric + c.amount > 9223372036854775807) INTO v_broken
    FROM (SELECT u.in_use, t.amount FROM quota_usages u
          JOIN unnest(v_resources, v_amounts) AS t(resource, amount) ON u.resource = t.resource
          WHERE u."partition" = r."partition" AND u.scope_type = 'queue' AND u.scope = r.queue
          ORDER BY u.scope, u.resource FOR UPDATE OF u) AS c;
    SELECT v_broken + count(*) FILTER (WHERE c.in_use::numeric + c.amount > 9223372036854775807)
    INTO v_broken
    FROM (SELECT u.in_use, t.amount FROM quota_usages u
          JOIN unnest(v_resources, v_amounts) AS t(resource, amount) ON u.resource = t.resource
          WHERE u."partition" = r."partition" AND u.scope_type = 'subtree' AND u.scope = ANY(v_scopes)
          ORDER BY u.scope, u.resource FOR UPDATE OF u) AS c;
    IF v_broken > 0 THEN
        RAISE EXCEPTION 'a counter is at the bigint limit' USING ERRCODE = 'QL001';
    END IF;
    UPDATE quota_usages u SET in_use = u.in_use + t.amount, reserved = u.reserved - t.amount,
                              updated_at = v_now
    FROM unnest(v_resources, v_amounts) AS t(resource, amount)
    WHERE u."partition" = r."partition" AND u.resource = t.resource
      AND ((u.scope_type = 'queue' AND u.scope = r.queue)
           OR (u.scope_type = 'subtree' AND u.scope = ANY(v_scopes)));
    RETURN QUERY SELECT r."partition"::text, r."key"::text, r.queue::text, r.priority_class::text,
                        r.created_at, r.expires_at, v_now, v_resources, v_amounts;
END
$$
"""

_EXPIRE = """
CREATE FUNCTION quota_ledger_expire(
    p_partition text, p_limit integer, p_skip_queues text[], p_version integer,
    p_lock_ns integer, p_lock_key integer
) RETURNS integer
LANGUAGE plpgsql
SET jit = off  -- a batch's row estimates are guesses; compiling would cost more than running
AS $$
DECLARE
    v_now timestamp;
    v_version integer;
    v_ids text[];
    v_queues text[];
    v_counters tid[];
    v_totals bigint[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_lock_ns, p_lock_key);
    v_now := TIMEZONE('UTC', clock_timestamp());
    SELECT version INTO v_version FROM quota_config_head WHERE id = 1;
    IF v_version IS DISTINCT FROM p_version THEN
        RAISE EXCEPTION 'configuration changed' USING ERRCODE = 'QL001';
    END IF;
    SELECT array_agg(s.id), array_agg(s.queue) INTO v_ids, v_queues
    FROM (SELECT id, queue FROM reservations
          WHERE "partition" = p_partition AND state = 'pending' AND expires_at <= v_now
            AND user_name IS NULL AND application IS NULL AND queue <> ALL(p_skip_queues)
          ORDER BY expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED) AS s;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    UPDATE reservations SET state = 'expired', resolved_at = v_now WHERE id = ANY(v_ids);
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
    -- find and lock the counters in one pass: queue counters, then subtree counters, each by
    -- scope and resource (the canonical order)
    SELECT array_agg(c.ctid), array_agg(c.total) INTO v_counters, v_totals
    FROM (SELECT u.ctid, t.total FROM (
              SELECT scope_type, scope, resource, sum(total)::bigint AS total FROM targets
              GROUP BY scope_type, scope, resource
          ) AS t
          JOIN quota_usages u ON u."partition" = p_partition AND u.scope_type = t.scope_type
                             AND u.scope = t.scope AND u.resource = t.resource
          ORDER BY u.scope_type = 'subtree', u.scope, u.resource
          FOR UPDATE OF u) AS c;
    -- by physical address: a row we hold locked cannot move
    UPDATE quota_usages u SET reserved = u.reserved - d.total, updated_at = v_now
    FROM unnest(v_counters, v_totals) AS d(tid, total) WHERE u.ctid = d.tid;
    RETURN cardinality(v_ids);
END
$$
"""

_COUNTER_TABLES = ("quota_usages", "quota_identity_usages")
_FUNCTIONS = (
    "quota_ledger_expire(text, integer, text[], integer, integer, integer)",
    "quota_ledger_commit(text, text)",
    "quota_ledger_reserve(text, text, text, text, text, text[], bigint[], bigint, text, text, integer,"
    " integer, integer, text[], text[], bigint[])",
    "quota_ledger_lineage(text)",
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for ddl in (_LINEAGE, _RESERVE, _COMMIT, _EXPIRE):
        op.execute(ddl)
    # Room on each page for the new version of an updated counter row: the update stays on
    # the page (HOT) and touches no index (in_use, reserved and updated_at are not indexed).
    for table in _COUNTER_TABLES:
        op.execute(f"ALTER TABLE {table} SET (fillfactor = 70)")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in _COUNTER_TABLES:
        op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    for signature in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
