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

_ENTER = """
CREATE FUNCTION quota_ledger_enter(p_lock_ns integer, p_lock_key integer, p_version integer)
RETURNS timestamp
LANGUAGE plpgsql AS $$
BEGIN
    -- the partition lock (shared: config writers take it exclusive), then the configuration
    -- version read under it, which must be the one the caller compiled; returns the clock
    PERFORM pg_advisory_xact_lock_shared(p_lock_ns, p_lock_key);
    IF (SELECT version FROM quota_config_head WHERE id = 1) IS DISTINCT FROM p_version THEN
        RAISE EXCEPTION 'configuration changed' USING ERRCODE = 'QL001';
    END IF;
    RETURN TIMEZONE('UTC', clock_timestamp());
END
$$
"""

_CHECK_UPDATED = """
CREATE FUNCTION quota_ledger_check_updated(p_updated integer, p_tids tid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- A counter locked in this transaction keeps its address until we update it; should that
    -- ever not hold, fail the whole call as a serialization failure (the driver retries it)
    -- rather than lose an update.
    IF p_updated <> coalesce(cardinality(p_tids), 0) THEN
        RAISE EXCEPTION 'a locked counter moved' USING ERRCODE = '40001';
    END IF;
END
$$
"""

_RESERVE = """
CREATE FUNCTION quota_ledger_reserve(
    p_id text, p_partition text, p_key text, p_request_hash text, p_queue text,
    p_resources text[], p_amounts bigint[], p_ttl_us bigint, p_priority_class text, p_kube text,
    p_version integer, p_lock_ns integer, p_lock_key integer,
    -- the ResourceQuota counters the request is charged to: (namespace/name, resource, amount)
    p_quota_names text[], p_quota_resources text[], p_quota_amounts bigint[],
    -- a tracked request: its identity, its application row (which must be running, with the
    -- group the caller expects) and the user/group counters that enforce it
    p_user text, p_groups text, p_application text, p_app_key text, p_group text,
    p_id_kinds text[], p_id_names text[], p_id_queues text[], p_id_resources text[], p_id_amounts bigint[]
) RETURNS timestamp
LANGUAGE plpgsql
-- Every read here is a lookup by key. A generic plan made while a table was small would scan
-- it and keep scanning it as it grows, on every call of a long-lived connection.
SET enable_seqscan = off
AS $$
DECLARE
    v_now timestamp;
    v_scopes text[] := quota_ledger_lineage(p_queue);
    v_count integer;
    v_broken integer;
    v_app quota_applications%ROWTYPE;
    v_usage jsonb;
    v_slot jsonb;
    v_tids tid[];
    v_deltas bigint[];
    v_id_tids tid[];
    v_id_deltas bigint[];
    v_quota_tids tid[];
    v_quota_deltas bigint[];
    v_updated integer;
BEGIN
    v_now := quota_ledger_enter(p_lock_ns, p_lock_key, p_version);
    -- our own new rows first (a same-key insert in flight makes us wait for it)
    INSERT INTO reservations (id, "partition", "key", request_hash, state, queue, user_name, "groups",
                              application, priority_class, created_at, expires_at, resolved_at, kube)
    VALUES (p_id, p_partition, p_key, p_request_hash, 'pending', p_queue, p_user, p_groups, p_application,
            p_priority_class, v_now, v_now + p_ttl_us * interval '1 microsecond', NULL, p_kube)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'reservation id or key exists' USING ERRCODE = 'QL001';
    END IF;
    INSERT INTO reservation_items (reservation_id, resource, amount)
    SELECT p_id, t.resource, t.amount FROM unnest(p_resources, p_amounts) AS t(resource, amount);
    -- the application row: a running application adds the request to its reserved usage
    IF p_app_key IS NOT NULL THEN
        SELECT * INTO v_app FROM quota_applications
        WHERE "partition" = p_partition AND app_key = p_app_key FOR UPDATE;
        IF NOT FOUND OR v_app.state <> 'running' OR v_app.user_name IS DISTINCT FROM p_user
           OR v_app.application IS DISTINCT FROM p_application OR v_app.queue <> p_queue
           OR v_app.group_name IS DISTINCT FROM p_group THEN
            RAISE EXCEPTION 'not a running application with the expected group' USING ERRCODE = 'QL001';
        END IF;
        v_usage := v_app."usage"::jsonb;
        FOR i IN 1 .. cardinality(p_resources) LOOP
            v_slot := coalesce(v_usage -> p_resources[i], '[0, 0]'::jsonb);
            v_usage := v_usage || jsonb_build_object(
                p_resources[i], jsonb_build_array((v_slot ->> 0)::bigint, (v_slot ->> 1)::bigint + p_amounts[i]));
        END LOOP;
        UPDATE quota_applications SET "usage" = v_usage::text, pending = v_app.pending + 1
        WHERE id = v_app.id;
    END IF;
    -- The shared counters, each set in the canonical order: the queue's own, the limits on its
    -- lineage, the user/group counters, the ResourceQuota counters. The wanted keys are sorted
    -- (byte order, as the columns' "C" collation sorts) and each is looked up and locked by its
    -- whole unique key in that order (LATERAL runs per key, in order; LIMIT 1 keeps it a
    -- lookup whatever the statistics say). Every update goes to the locked row's address.
    SELECT count(*), count(*) FILTER (WHERE c.in_use::numeric + c.reserved + c.amount > 9223372036854775807),
           array_agg(c.ctid), array_agg(c.amount)
    INTO v_count, v_broken, v_tids, v_deltas
    FROM (SELECT t.resource, t.amount FROM unnest(p_resources, p_amounts) AS t(resource, amount)
          ORDER BY t.resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, u.in_use, u.reserved, w.amount FROM quota_usages u
        WHERE u."partition" = p_partition AND u.scope_type = 'queue' AND u.scope = p_queue
          AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    IF v_count < cardinality(p_resources) OR v_broken > 0 THEN
        RAISE EXCEPTION 'counters missing or at the bigint limit' USING ERRCODE = 'QL001';
    END IF;
    SELECT count(*) FILTER (WHERE c.in_use::numeric + c.reserved + c.amount
                                  > coalesce(c.hard_limit, 9223372036854775807)),
           v_tids || array_agg(c.ctid), v_deltas || array_agg(c.amount)
    INTO v_broken, v_tids, v_deltas
    FROM (SELECT s.scope, t.resource, t.amount
          FROM unnest(v_scopes) AS s(scope) CROSS JOIN unnest(p_resources, p_amounts) AS t(resource, amount)
          ORDER BY s.scope COLLATE "C", t.resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, u.in_use, u.reserved, u.hard_limit, w.amount FROM quota_usages u
        WHERE u."partition" = p_partition AND u.scope_type = 'subtree' AND u.scope = w.scope
          AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    IF v_broken > 0 THEN
        RAISE EXCEPTION 'over a limit' USING ERRCODE = 'QL001';
    END IF;
    IF cardinality(p_id_kinds) > 0 THEN
        SELECT count(*), count(*) FILTER (WHERE c.in_use::numeric + c.reserved + c.amount > c.hard_limit),
               array_agg(c.ctid), array_agg(c.amount)
        INTO v_count, v_broken, v_id_tids, v_id_deltas
        FROM (SELECT t.* FROM unnest(p_id_kinds, p_id_names, p_id_queues, p_id_resources, p_id_amounts)
                AS t(kind, name, queue, resource, amount)
              ORDER BY t.kind COLLATE "C", t.name COLLATE "C", t.queue COLLATE "C",
                       t.resource COLLATE "C") AS w
        CROSS JOIN LATERAL (
            SELECT u.ctid, u.in_use, u.reserved, u.hard_limit, w.amount FROM quota_identity_usages u
            WHERE u."partition" = p_partition AND u.kind = w.kind AND u.name = w.name
              AND u.queue = w.queue AND u.resource = w.resource
            LIMIT 1 FOR UPDATE) AS c;
        IF v_count < cardinality(p_id_kinds) OR v_broken > 0 THEN
            RAISE EXCEPTION 'a user or group counter is missing or full' USING ERRCODE = 'QL001';
        END IF;
    END IF;
    -- a quota counts the live reservations it matches in in_use, from reserve on
    IF cardinality(p_quota_names) > 0 THEN
        SELECT count(*), count(*) FILTER (WHERE c.in_use::numeric + c.reserved + c.amount > c.hard_limit),
               array_agg(c.ctid), array_agg(c.amount)
        INTO v_count, v_broken, v_quota_tids, v_quota_deltas
        FROM (SELECT t.* FROM unnest(p_quota_names, p_quota_resources, p_quota_amounts)
                AS t(name, resource, amount)
              ORDER BY t.name COLLATE "C", t.resource COLLATE "C") AS w
        CROSS JOIN LATERAL (
            SELECT u.ctid, u.in_use, u.reserved, u.hard_limit, w.amount FROM quota_identity_usages u
            WHERE u."partition" = p_partition AND u.kind = 'quota' AND u.name = w.name
              AND u.queue = p_queue AND u.resource = w.resource
            LIMIT 1 FOR UPDATE) AS c;
        IF v_count < cardinality(p_quota_names) OR v_broken > 0 THEN
            RAISE EXCEPTION 'a ResourceQuota counter is missing or full' USING ERRCODE = 'QL001';
        END IF;
    END IF;
    -- (a row we hold locked cannot move, so its address stays good until we update it)
    UPDATE quota_usages u SET reserved = u.reserved + d.amount, updated_at = v_now
    FROM unnest(v_tids, v_deltas) AS d(tid, amount) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_tids);
    UPDATE quota_identity_usages u SET reserved = u.reserved + d.amount, updated_at = v_now
    FROM unnest(v_id_tids, v_id_deltas) AS d(tid, amount) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_id_tids);
    UPDATE quota_identity_usages u SET in_use = u.in_use + d.amount, updated_at = v_now
    FROM unnest(v_quota_tids, v_quota_deltas) AS d(tid, amount) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_quota_tids);
    RETURN v_now;
END
$$
"""

_COMMIT = """
CREATE FUNCTION quota_ledger_commit(p_id text, p_operation_id text)
RETURNS TABLE ("partition" text, "key" text, queue text, user_name text, "groups" text,
               application text, priority_class text, created_at timestamp, expires_at timestamp,
               resolved_at timestamp, resources text[], amounts bigint[])
LANGUAGE plpgsql
SET enable_seqscan = off  -- lookups by key only (see quota_ledger_reserve)
AS $$
DECLARE
    r reservations%ROWTYPE;
    v_now timestamp;
    v_resources text[];
    v_amounts bigint[];
    v_scopes text[];
    v_broken integer;
    v_app quota_applications%ROWTYPE;
    v_usage jsonb;
    v_area jsonb;
    v_micros numeric;
    v_slot jsonb;
    v_in_use bigint;
    v_tids tid[];
    v_deltas bigint[];
    v_id_tids tid[];
    v_id_deltas bigint[];
    v_updated integer;
BEGIN
    SELECT * INTO r FROM reservations WHERE id = p_id FOR UPDATE;
    v_now := TIMEZONE('UTC', clock_timestamp());
    IF NOT FOUND OR r.state <> 'pending' OR v_now >= r.expires_at THEN
        RAISE EXCEPTION 'not a pending reservation' USING ERRCODE = 'QL001';
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
    -- a tracked reservation: its application's usage moves from reserved to in use, and the
    -- in-use usage so far is integrated up to now (microseconds, as the Python path does)
    IF r.user_name IS NOT NULL OR r.application IS NOT NULL THEN
        SELECT * INTO v_app FROM quota_applications a
        WHERE a."partition" = r."partition"
          AND a.app_key = coalesce(r.application, E'\\t' || r.user_name || E'\\t' || r.queue)
        FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no application row' USING ERRCODE = 'QL001';
        END IF;
        v_usage := v_app."usage"::jsonb;
        v_area := v_app.area::jsonb;
        IF v_now > v_app.changed_at THEN
            v_micros := floor(EXTRACT(EPOCH FROM (v_now - v_app.changed_at)) * 1000000);
            FOR v_slot IN SELECT jsonb_build_array(e.key, e.value) FROM jsonb_each(v_usage) AS e LOOP
                v_in_use := (v_slot -> 1 ->> 0)::bigint;
                IF v_in_use <> 0 THEN
                    v_area := v_area || jsonb_build_object(v_slot ->> 0,
                        (coalesce((v_area ->> (v_slot ->> 0))::numeric, 0) + v_in_use * v_micros)::text);
                END IF;
            END LOOP;
            v_app.changed_at := v_now;
        END IF;
        FOR i IN 1 .. cardinality(v_resources) LOOP
            v_slot := coalesce(v_usage -> v_resources[i], '[0, 0]'::jsonb);
            v_slot := jsonb_build_array((v_slot ->> 0)::bigint + v_amounts[i],
                                        greatest(0, (v_slot ->> 1)::bigint - v_amounts[i]));
            IF (v_slot ->> 0)::bigint = 0 AND (v_slot ->> 1)::bigint = 0 THEN
                v_usage := v_usage - v_resources[i];
            ELSE
                v_usage := v_usage || jsonb_build_object(v_resources[i], v_slot);
            END IF;
        END LOOP;
        UPDATE quota_applications
        SET "usage" = v_usage::text, area = v_area::text, changed_at = v_app.changed_at,
            started_at = coalesce(v_app.started_at, v_now), pending = greatest(0, v_app.pending - 1)
        WHERE id = v_app.id;
    END IF;
    -- the counters in the canonical order, looked up by their whole unique key (see reserve)
    SELECT count(*) FILTER (WHERE c.in_use::numeric + c.amount > 9223372036854775807),
           array_agg(c.ctid), array_agg(c.amount)
    INTO v_broken, v_tids, v_deltas
    FROM (SELECT t.resource, t.amount FROM unnest(v_resources, v_amounts) AS t(resource, amount)
          ORDER BY t.resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, u.in_use, w.amount FROM quota_usages u
        WHERE u."partition" = r."partition" AND u.scope_type = 'queue' AND u.scope = r.queue
          AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    SELECT v_broken + count(*) FILTER (WHERE c.in_use::numeric + c.amount > 9223372036854775807),
           v_tids || array_agg(c.ctid), v_deltas || array_agg(c.amount)
    INTO v_broken, v_tids, v_deltas
    FROM (SELECT s.scope, t.resource, t.amount
          FROM unnest(v_scopes) AS s(scope) CROSS JOIN unnest(v_resources, v_amounts) AS t(resource, amount)
          ORDER BY s.scope COLLATE "C", t.resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, u.in_use, w.amount FROM quota_usages u
        WHERE u."partition" = r."partition" AND u.scope_type = 'subtree' AND u.scope = w.scope
          AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    IF v_app.id IS NOT NULL THEN
        -- the user's and the application's group's counters on the lineage
        SELECT v_broken + count(*) FILTER (WHERE c.in_use::numeric + c.amount > 9223372036854775807),
               array_agg(c.ctid), array_agg(c.amount)
        INTO v_broken, v_id_tids, v_id_deltas
        FROM (SELECT k.kind, k.name, s.queue, t.resource, t.amount
              FROM (VALUES ('user', v_app.user_name), ('group', v_app.group_name)) AS k(kind, name)
              CROSS JOIN unnest(v_scopes) AS s(queue)
              CROSS JOIN unnest(v_resources, v_amounts) AS t(resource, amount)
              WHERE k.name IS NOT NULL
              ORDER BY k.kind COLLATE "C", k.name COLLATE "C", s.queue COLLATE "C",
                       t.resource COLLATE "C") AS w
        CROSS JOIN LATERAL (
            SELECT u.ctid, u.in_use, w.amount FROM quota_identity_usages u
            WHERE u."partition" = r."partition" AND u.kind = w.kind AND u.name = w.name
              AND u.queue = w.queue AND u.resource = w.resource
            LIMIT 1 FOR UPDATE) AS c;
    END IF;
    IF v_broken > 0 THEN
        RAISE EXCEPTION 'a counter is at the bigint limit' USING ERRCODE = 'QL001';
    END IF;
    UPDATE quota_usages u SET in_use = u.in_use + d.amount, reserved = u.reserved - d.amount,
                              updated_at = v_now
    FROM unnest(v_tids, v_deltas) AS d(tid, amount) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_tids);
    UPDATE quota_identity_usages u SET in_use = u.in_use + d.amount, reserved = u.reserved - d.amount,
                                       updated_at = v_now
    FROM unnest(v_id_tids, v_id_deltas) AS d(tid, amount) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_id_tids);
    RETURN QUERY SELECT r."partition"::text, r."key"::text, r.queue::text, r.user_name::text, r."groups",
                        r.application::text, r.priority_class::text, r.created_at, r.expires_at, v_now,
                        v_resources, v_amounts;
END
$$
"""

_EXPIRE = """
CREATE FUNCTION quota_ledger_expire(
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
    v_queues text[];
    v_counters tid[];
    v_totals bigint[];
    v_updated integer;
BEGIN
    v_now := quota_ledger_enter(p_lock_ns, p_lock_key, p_version);
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

_COUNTER_TABLES = ("quota_usages", "quota_identity_usages")
_FUNCTIONS = (
    "quota_ledger_expire(text, integer, text[], integer, integer, integer)",
    "quota_ledger_commit(text, text)",
    "quota_ledger_reserve(text, text, text, text, text, text[], bigint[], bigint, text, text, integer,"
    " integer, integer, text[], text[], bigint[], text, text, text, text, text, text[], text[], text[],"
    " text[], bigint[])",
    "quota_ledger_check_updated(integer, tid[])",
    "quota_ledger_enter(integer, integer, integer)",
    "quota_ledger_lineage(text)",
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for ddl in (_LINEAGE, _ENTER, _CHECK_UPDATED, _RESERVE, _COMMIT, _EXPIRE):
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
