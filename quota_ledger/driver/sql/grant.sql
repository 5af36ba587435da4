-- quota_ledger_grant(grant, notice, ...): grants the waiting request p_grant if it fits now, and
-- leaves exactly the rows the general path leaves granting it: the row pending, made now, its
-- ttl (ttl_ms) counted from now and cleared, and every counter charged as a new reserve of the
-- same request would charge it, decided by quota_ledger_reserve_many with the same arguments
-- (the request as a reserve of its own: p_ids holds one id, a fresh one). That call's row and
-- items are a stand-in, deleted again once its charges are the waiting row's: the waiting row
-- keeps its id, key, items and place in line. A grant is heard at commit on the channel
-- quota_ledger_line (p_notice). Returns one row, its outcome:
--   'granted': with the grant's instant; whether the same request again would fit right after
--     it (NULL for a tracked request, whose first one may start its application); and the
--     subtree counters (ids) it charged with its resources, with what it added to each;
--   'left': the row no longer waits (another transaction decided it, and its callers hear of it
--     from there);
--   'over': not granted, the configuration in force is p_version, and a counter it is charged
--     to (a subtree limit, a user or group limit other than maxapplications, a ResourceQuota)
--     holds too much to take it: the rule refuses it too. Nothing was written.
-- No row (nothing written; the general path decides): its wait ran out, or
-- quota_ledger_reserve_many declined it for another reason (another configuration version, a
-- first use it leaves to the general path).
-- Locks the waiting row (step 3), then what quota_ledger_reserve_many locks, in its order.
CREATE OR REPLACE FUNCTION quota_ledger_grant(
    p_grant text, p_notice text,
    p_partition text, p_version integer, p_lock_ns integer, p_lock_key integer,
    p_ids text[], p_keys text[], p_request_hashes text[], p_queues text[], p_groups text[],
    p_ttl_us bigint[], p_priority_classes text[], p_kubes text[],
    p_users text[], p_applications text[], p_app_keys text[], p_app_groups text[],
    p_item_owners integer[], p_item_resources text[], p_item_amounts bigint[],
    p_id_owners integer[], p_id_kinds text[], p_id_names text[], p_id_queues text[], p_id_resources text[],
    p_id_amounts bigint[], p_id_limits bigint[],
    p_quota_owners integer[], p_quota_names text[], p_quota_resources text[], p_quota_amounts bigint[]
) RETURNS TABLE (outcome text, created_at timestamp, again boolean, counter_ids bigint[], counter_amounts bigint[])
LANGUAGE plpgsql
SET enable_seqscan = off  -- lookups by key only: a plan cached while a table was small must not scan it
SET plan_cache_mode = force_generic_plan  -- one request: each statement planned once per connection
AS $$
DECLARE
    v_found boolean;
    v_now timestamp;
    v_expires timestamp;
    v_again boolean;
    v_ids bigint[];
    v_amounts bigint[];
BEGIN
    SELECT true INTO v_found
    FROM reservations r
    WHERE r.id = p_grant AND r.state = 'waiting' AND r.expires_at > TIMEZONE('UTC', clock_timestamp())
    FOR UPDATE;
    -- (a row locked after a wait is the newest version, and is checked again: FOR UPDATE)
    IF v_found IS NULL THEN
        -- a row that left the line (another transaction decided it, and its callers hear of it)
        -- answers a row of NULLs; one whose wait ran out, nothing (the general path ends it)
        RETURN QUERY SELECT 'left', NULL::timestamp, NULL::boolean, NULL::bigint[], NULL::bigint[]
        FROM reservations r WHERE r.id = p_grant AND r.state <> 'waiting';
        RETURN;
    END IF;
    SELECT m.created_at INTO v_now
    FROM quota_ledger_reserve_many(
        p_partition, p_version, p_lock_ns, p_lock_key, p_ids, p_keys, p_request_hashes, p_queues, p_groups,
        p_ttl_us, p_priority_classes, p_kubes, p_users, p_applications, p_app_keys, p_app_groups,
        p_item_owners, p_item_resources, p_item_amounts, p_id_owners, p_id_kinds, p_id_names, p_id_queues,
        p_id_resources, p_id_amounts, p_id_limits, p_quota_owners, p_quota_names, p_quota_resources,
        p_quota_amounts) AS m;
    IF v_now IS NULL THEN
        -- (under the partition lock the call took: the configuration cannot change until commit)
        IF (SELECT h.version FROM quota_config_head h WHERE h.id = 1) = p_version AND quota_ledger_over(p_partition, p_queues[1], p_item_resources, p_item_amounts, p_id_kinds, p_id_names,
                             p_id_queues, p_id_resources, p_id_amounts, p_quota_names, p_quota_resources,
                             p_quota_amounts) THEN
            RETURN QUERY SELECT 'over', NULL::timestamp, NULL::boolean, NULL::bigint[], NULL::bigint[];
        END IF;
        RETURN;
    END IF;
    -- the stand-in's charges are the waiting row's now
    DELETE FROM reservation_items i WHERE i.reservation_id = p_ids[1];
    DELETE FROM reservations r WHERE r.id = p_ids[1] RETURNING r.expires_at INTO v_expires;
    UPDATE reservations r SET state = 'pending', created_at = v_now, expires_at = v_expires, ttl_ms = NULL
    WHERE r.id = p_grant;
    PERFORM pg_notify('quota_ledger_line', p_notice);
    -- the same request again: over no limit it was charged to (counters this call holds)
    IF p_users[1] IS NULL AND p_applications[1] IS NULL THEN
        v_again := NOT quota_ledger_over(p_partition, p_queues[1], p_item_resources, p_item_amounts, p_id_kinds,
                                         p_id_names, p_id_queues, p_id_resources, p_id_amounts, p_quota_names,
                                         p_quota_resources, p_quota_amounts);
    END IF;
    SELECT array_agg(u.id ORDER BY u.id), array_agg(t.amount ORDER BY u.id) INTO v_ids, v_amounts
    FROM (SELECT s.scope, i.resource, i.amount
          FROM unnest(p_item_resources, p_item_amounts) AS i(resource, amount)
          CROSS JOIN unnest(quota_ledger_lineage(p_queues[1])) AS s(scope)) AS t
    JOIN quota_usages u ON u."partition" = p_partition AND u.scope_type = 'subtree' AND u.scope = t.scope
                       AND u.resource = t.resource;
    RETURN QUERY SELECT 'granted', v_now, v_again, v_ids, v_amounts;
END
$$;
