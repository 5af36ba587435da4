-- quota_ledger_expire(partition, limit, skipped queues, version, lock namespace, lock key):
-- expires up to `limit` plain (no user, no application) pending reservations whose time is up,
-- grouped by queue: the queues of the oldest, each taken whole while the batch has room, topped
-- up oldest-first past rows another sweeper holds. Returns how many it expired. Its transaction
-- commits without waiting for the WAL flush. Installed by revision 0005 (expire_v1.sql is 0004's).
-- Locks the partition (advisory, shared, in quota_ledger_enter), the reservation rows (FOR UPDATE
-- SKIP LOCKED), then each counter once per batch, looked up by its whole unique key: the queue
-- counters, then the subtree counters, by scope and resource in byte order.
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
$$;
