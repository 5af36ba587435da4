-- quota_ledger_expire as revision 0004 installed it; revision 0005 replaced it with expire.sql,
-- and its downgrade installs this one again. Superseded: kept as it was, never edited.
-- Expires up to `limit` plain (no user, no application) pending reservations whose time is up,
-- the oldest first whatever their queue. Returns how many it expired.
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
$$;
