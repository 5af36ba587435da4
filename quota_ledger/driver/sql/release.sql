-- quota_ledger_release(id, operation id, committed): gives back what one plain reservation holds,
-- once, and leaves exactly the rows the general path leaves: a pending one is rolled back (its
-- state and resolved_at; what it reserved given back), and, with p_committed, a committed one
-- still held is released (its released_at; what it committed given back as in use, and its
-- journal rows, kind 'release', one per resource), on its queue's own counters and on the
-- subtree counters of its queue's lineage. Declined (no row returned, nothing written; the
-- general path decides in the same transaction, under the locks taken here): a reservation in
-- any other state, a tracked one (a user or an application: its application row and user/group
-- counters change too), one whose queue has a ResourceQuota counter for a resource of its
-- Kubernetes usage, one that holds nothing, and one whose queue counters hold less than it gives
-- back (the general path raises). Never raises QL001, so it never aborts the caller's
-- transaction. Returns the reservation as a read by id returns it (a row per item), each row
-- with the ids of the subtree counters it gave back to (those that may limit a request) and what
-- each got back.
-- Locks the reservation row (step 3); then its queue's own counters, in byte order of resource;
-- then the subtree counters of its lineage, in byte order of (scope, resource). No partition
-- lock.
CREATE OR REPLACE FUNCTION quota_ledger_release(p_id text, p_operation_id text, p_committed boolean)
RETURNS TABLE (id text, "partition" text, "key" text, request_hash text, state text, queue text,
               user_name text, "groups" text, application text, priority_class text,
               created_at timestamp, expires_at timestamp, resolved_at timestamp, kube text,
               released_at timestamp, priority integer, resource text, amount bigint, committed bigint,
               counter_ids bigint[], counter_deltas bigint[])
LANGUAGE plpgsql
SET enable_seqscan = off  -- lookups by key only: a plan cached while a table was small must not scan it
SET plan_cache_mode = force_generic_plan  -- one reservation: each statement planned once per connection
AS $$
DECLARE
    v_now timestamp;
    v_partition text;
    v_queue text;
    v_pending boolean;
    v_usage jsonb;
    v_resources text[];
    v_amounts bigint[];
    v_short boolean;
    v_tids tid[];
    v_ids bigint[];
    v_deltas bigint[];
    v_given bigint[];
    v_updated integer;
BEGIN
    SELECT TIMEZONE('UTC', clock_timestamp()), r."partition", r.queue, r.state = 'pending', r.kube::jsonb -> 'usage'
    INTO v_now, v_partition, v_queue, v_pending, v_usage
    FROM reservations r
    WHERE r.id = p_id AND r.user_name IS NULL AND r.application IS NULL
      AND (r.state = 'pending' OR (p_committed AND r.state = 'committed' AND r.released_at IS NULL))
    FOR UPDATE;
    -- (a row locked after a wait is the newest version, and is checked again: FOR UPDATE)
    IF v_partition IS NULL THEN
        RETURN;
    END IF;
    -- a ResourceQuota counter of its queue for a resource of its Kubernetes usage: the general
    -- path takes it out of the quotas that count it (whichever match it, by the rules in force)
    IF v_usage IS NOT NULL AND v_usage <> '{}'::jsonb AND EXISTS (
        SELECT 1 FROM quota_identity_usages q
        WHERE q."partition" = v_partition AND q.kind = 'quota' AND q.queue = v_queue
          AND q.resource = ANY (ARRAY(SELECT jsonb_object_keys(v_usage)))) THEN
        RETURN;
    END IF;
    -- what it gives back: a pending one, what it reserved; a committed one, what it committed
    SELECT array_agg(i.resource ORDER BY i.resource COLLATE "C"),
           array_agg(CASE WHEN v_pending THEN i.amount ELSE i.committed END ORDER BY i.resource COLLATE "C")
    INTO v_resources, v_amounts
    FROM reservation_items i
    WHERE i.reservation_id = p_id AND CASE WHEN v_pending THEN i.amount ELSE i.committed END > 0;
    IF v_resources IS NULL THEN
        RETURN;
    END IF;
    -- the queue's own counters, then the subtree counters of its lineage, each locked by its
    -- whole key, in order (LATERAL runs per key; LIMIT 1 keeps it a lookup)
    WITH own AS (
        SELECT c.ctid AS tid, c.id, c.held, t.amount
        FROM unnest(v_resources, v_amounts) AS t(resource, amount)
        LEFT JOIN LATERAL (
            SELECT u.ctid, u.id, CASE WHEN v_pending THEN u.reserved ELSE u.in_use END AS held
            FROM quota_usages u
            WHERE u."partition" = v_partition AND u.scope_type = 'queue' AND u.scope = v_queue
              AND u.resource = t.resource
            LIMIT 1 FOR UPDATE) AS c ON true),
    lineage AS (
        SELECT c.ctid AS tid, c.id, c.held, t.amount
        FROM (SELECT s.scope, t.resource, t.amount
              FROM unnest(quota_ledger_lineage(v_queue)) AS s(scope)
              CROSS JOIN unnest(v_resources, v_amounts) AS t(resource, amount)
              ORDER BY s.scope COLLATE "C", t.resource COLLATE "C") AS t
        JOIN LATERAL (
            SELECT u.ctid, u.id, CASE WHEN v_pending THEN u.reserved ELSE u.in_use END AS held
            FROM quota_usages u
            WHERE u."partition" = v_partition AND u.scope_type = 'subtree' AND u.scope = t.scope
              AND u.resource = t.resource
            LIMIT 1 FOR UPDATE) AS c ON true)
    SELECT bool_or(o.tid IS NULL OR o.held < o.amount), array_agg(o.tid), array_agg(o.amount),
           array_agg(o.id) FILTER (WHERE o.limits), array_agg(o.amount) FILTER (WHERE o.limits)
    INTO v_short, v_tids, v_deltas, v_ids, v_given
    FROM (SELECT *, false AS limits FROM own UNION ALL SELECT *, true FROM lineage) AS o;
    IF v_short THEN
        RETURN;
    END IF;
    IF v_pending THEN
        UPDATE reservations r SET state = 'rolled_back', resolved_at = v_now WHERE r.id = p_id;
        UPDATE quota_usages u SET reserved = u.reserved - d.amount, updated_at = v_now
        FROM unnest(v_tids, v_deltas) AS d(tid, amount)
        WHERE u.ctid = d.tid;
    ELSE
        UPDATE reservations r SET released_at = v_now WHERE r.id = p_id;
        UPDATE quota_usages u SET in_use = u.in_use - d.amount, updated_at = v_now
        FROM unnest(v_tids, v_deltas) AS d(tid, amount)
        WHERE u.ctid = d.tid;
    END IF;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_tids);
    IF NOT v_pending THEN
        INSERT INTO quota_journal ("partition", queue, resource, delta, kind, reservation_id, operation_id,
                                   created_at)
        SELECT v_partition, v_queue, t.resource, -t.amount, 'release', p_id, p_operation_id, v_now
        FROM unnest(v_resources, v_amounts) AS t(resource, amount);
    END IF;
    RETURN QUERY
    SELECT r.id::text, r."partition"::text, r."key"::text, r.request_hash::text, r.state::text, r.queue::text,
           r.user_name::text, r."groups"::text, r.application::text, r.priority_class::text, r.created_at,
           r.expires_at, r.resolved_at, r.kube::text, r.released_at, r.priority::integer, i.resource::text,
           i.amount::bigint, i.committed::bigint, v_ids, v_given
    FROM reservations r LEFT JOIN reservation_items i ON i.reservation_id = r.id
    WHERE r.id = p_id;
END
$$;
