-- quota_ledger_reserve_many(...): plain reservations of one partition (no user, application or
-- ResourceQuota charge) decided together, as quota_ledger_reserve would decide them one after
-- another in the order given, with one statement per step for all of them. Request i (1-based)
-- has the items whose owner is i. A first use of a queue creates its counters, as
-- quota_ledger_reserve does. A request whose id or key exists, or that names a resource the
-- partition names nowhere yet, is declined and set aside. Of the others, the longest prefix whose
-- running totals stay within every counter is admitted; the first that would go over a limit (or
-- the bigint limit), and every one after it, is declined. Nothing of a declined request
-- survives, and the caller decides it alone. Another configuration version declines them all.
-- Never raises QL001. Returns (created_at, idx) for each admitted request.
-- Locks, in the canonical order: the partition (advisory, shared); the new reservation rows;
-- then, after inserting the missing queue counters, the counters, each looked up by its whole
-- unique key in byte order: the queues' own counters, then the subtree counters of their
-- lineages.
CREATE OR REPLACE FUNCTION quota_ledger_reserve_many(
    p_partition text, p_version integer, p_lock_ns integer, p_lock_key integer,
    p_ids text[], p_keys text[], p_request_hashes text[], p_queues text[], p_groups text[],
    p_ttl_us bigint[], p_priority_classes text[], p_kubes text[],
    p_item_owners integer[], p_item_resources text[], p_item_amounts bigint[]
) RETURNS TABLE (created_at timestamp, idx integer)
LANGUAGE plpgsql
SET enable_seqscan = off  -- lookups by key only (see quota_ledger_reserve)
AS $$
DECLARE
    v_now timestamp;
    v_inserted integer[];
    -- requests inserted but set aside (a resource new to the partition, a counter missing)
    v_aside integer[];
    v_first_over integer;
    v_admitted integer[];
    v_tids tid[];
    v_dis bigint[];
    v_drs bigint[];
    v_updated integer;
    -- what each request charges: (request, kind, scope, resource, amount)
    w_idx integer[];
    w_kind integer[];
    w_scope text[];
    w_resource text[];
    w_amount bigint[];
    -- the counters locked: (kind, scope, resource, address, in use + reserved, cap)
    l_kind integer[];
    l_scope text[];
    l_resource text[];
    l_tid tid[];
    l_used numeric[];
    l_cap numeric[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_lock_ns, p_lock_key);
    IF (SELECT version FROM quota_config_head WHERE id = 1) IS DISTINCT FROM p_version THEN
        RETURN;
    END IF;
    v_now := TIMEZONE('UTC', clock_timestamp());
    -- our own new rows first (an insert of the same key in flight makes us wait for it)
    WITH inserted AS (
        INSERT INTO reservations (id, "partition", "key", request_hash, state, queue, user_name, "groups",
                                  application, priority_class, created_at, expires_at, resolved_at, kube)
        SELECT t.id, p_partition, t.key, t.request_hash, 'pending', t.queue, NULL, t.groups, NULL,
               t.priority_class, v_now, v_now + t.ttl_us * interval '1 microsecond', NULL, t.kube
        FROM unnest(p_ids, p_keys, p_request_hashes, p_queues, p_groups, p_ttl_us, p_priority_classes, p_kubes)
             WITH ORDINALITY AS t(id, key, request_hash, queue, groups, ttl_us, priority_class, kube, n)
        ORDER BY t.n
        ON CONFLICT DO NOTHING
        RETURNING id)
    SELECT array_agg(t.n::integer) INTO v_inserted
    FROM inserted JOIN unnest(p_ids) WITH ORDINALITY AS t(id, n) ON t.id = inserted.id;
    IF v_inserted IS NULL THEN
        RETURN;
    END IF;
    -- First uses: a resource the partition names nowhere yet is left to the general path, which
    -- checks the partition's bound on distinct resource names; the queue counters missing are
    -- created before any counter is locked (then two first uses cannot deadlock).
    SELECT array_agg(DISTINCT i.owner) INTO v_aside
    FROM unnest(p_item_owners, p_item_resources) AS i(owner, resource)
    WHERE i.owner = ANY (v_inserted) AND NOT EXISTS (
        SELECT 1 FROM quota_usages u WHERE u."partition" = p_partition AND u.resource = i.resource);
    IF EXISTS (
        SELECT 1 FROM unnest(p_item_owners, p_item_resources) AS i(owner, resource)
        WHERE i.owner = ANY (v_inserted) AND NOT i.owner = ANY (coalesce(v_aside, '{}'))
          AND NOT EXISTS (
            SELECT 1 FROM quota_usages u
            WHERE u."partition" = p_partition AND u.scope_type = 'queue' AND u.scope = p_queues[i.owner]
              AND u.resource = i.resource)) THEN
        INSERT INTO quota_partitions (name, created_at) VALUES (p_partition, v_now) ON CONFLICT DO NOTHING;
        INSERT INTO quota_usages ("partition", scope_type, scope, resource, in_use, reserved, hard_limit, updated_at)
        SELECT p_partition, 'queue', m.queue, m.resource, 0, 0, NULL, v_now
        FROM (SELECT DISTINCT p_queues[i.owner] AS queue, i.resource
              FROM unnest(p_item_owners, p_item_resources) AS i(owner, resource)
              WHERE i.owner = ANY (v_inserted) AND NOT i.owner = ANY (coalesce(v_aside, '{}'))) AS m
        ORDER BY m.queue COLLATE "C", m.resource COLLATE "C"
        ON CONFLICT DO NOTHING;
    END IF;
    -- What each inserted request charges: its queue's own counters and the subtree counters of
    -- its lineage (kind 0 and 1), locked in that order, each set in byte order.
    SELECT array_agg(i.owner), array_agg(k.kind), array_agg(k.scope), array_agg(i.resource), array_agg(i.amount)
    INTO w_idx, w_kind, w_scope, w_resource, w_amount
    FROM unnest(p_item_owners, p_item_resources, p_item_amounts) AS i(owner, resource, amount)
    CROSS JOIN LATERAL (
        SELECT 0 AS kind, p_queues[i.owner] AS scope
        UNION ALL
        SELECT 1, s.scope FROM unnest(quota_ledger_lineage(p_queues[i.owner])) AS s(scope)) AS k
    WHERE i.owner = ANY (v_inserted) AND NOT i.owner = ANY (coalesce(v_aside, '{}'));
    IF w_idx IS NULL THEN
        DELETE FROM reservations r WHERE r.id = ANY (SELECT p_ids[n] FROM unnest(v_inserted) AS n);
        RETURN;
    END IF;
    SELECT array_agg(w.kind), array_agg(w.scope), array_agg(w.resource), array_agg(c.ctid),
           array_agg(c.in_use::numeric + c.reserved),
           array_agg(CASE WHEN w.kind = 0 THEN 9223372036854775807
                          ELSE coalesce(c.hard_limit, 9223372036854775807) END)
    INTO l_kind, l_scope, l_resource, l_tid, l_used, l_cap
    FROM (SELECT t.kind, t.scope, t.resource FROM unnest(w_kind, w_scope, w_resource) AS t(kind, scope, resource)
          GROUP BY t.kind, t.scope, t.resource
          ORDER BY t.kind, t.scope COLLATE "C", t.resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, u.in_use, u.reserved, u.hard_limit FROM quota_usages u
        WHERE u."partition" = p_partition AND u.scope_type = CASE w.kind WHEN 0 THEN 'queue' ELSE 'subtree' END
          AND u.scope = w.scope AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    -- a request whose own counter is missing still (removed meanwhile) is set aside too; the
    -- first other one whose running totals go over a counter ends the prefix admitted
    v_aside := coalesce(v_aside, '{}') || ARRAY(
        SELECT DISTINCT w.idx FROM unnest(w_idx, w_kind, w_scope, w_resource) AS w(idx, kind, scope, resource)
        WHERE w.kind = 0 AND NOT EXISTS (
            SELECT 1 FROM unnest(l_kind, l_scope, l_resource) AS l(kind, scope, resource)
            WHERE l.kind = 0 AND l.scope = w.scope AND l.resource = w.resource));
    SELECT min(r.idx) INTO v_first_over
    FROM (SELECT w.idx, w.kind, w.scope, w.resource,
                 sum(w.amount) OVER (PARTITION BY w.kind, w.scope, w.resource ORDER BY w.idx) AS total
          FROM unnest(w_idx, w_kind, w_scope, w_resource, w_amount) AS w(idx, kind, scope, resource, amount)
          WHERE NOT w.idx = ANY (v_aside)) AS r
    JOIN unnest(l_kind, l_scope, l_resource, l_used, l_cap) AS l(kind, scope, resource, used, cap)
      ON l.kind = r.kind AND l.scope = r.scope AND l.resource = r.resource
    WHERE l.used + r.total > l.cap;
    SELECT array_agg(n ORDER BY n) INTO v_admitted FROM unnest(v_inserted) AS n
    WHERE NOT n = ANY (v_aside) AND (v_first_over IS NULL OR n < v_first_over);
    DELETE FROM reservations r
    WHERE r.id = ANY (SELECT p_ids[n] FROM unnest(v_inserted) AS n
                      WHERE NOT n = ANY (coalesce(v_admitted, '{}')));
    IF v_admitted IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO reservation_items (reservation_id, resource, amount)
    SELECT p_ids[i.owner], i.resource, i.amount
    FROM unnest(p_item_owners, p_item_resources, p_item_amounts) AS i(owner, resource, amount)
    WHERE i.owner = ANY (v_admitted);
    -- every counter charged once with the admitted requests' sum (a running-application count
    -- is in use at once; resources are reserved)
    SELECT array_agg(l.tid),
           array_agg(CASE WHEN l.kind = 1 AND l.resource = 'applications' THEN s.amount ELSE 0 END),
           array_agg(CASE WHEN l.kind = 1 AND l.resource = 'applications' THEN 0 ELSE s.amount END)
    INTO v_tids, v_dis, v_drs
    FROM (SELECT w.kind, w.scope, w.resource, sum(w.amount)::bigint AS amount
          FROM unnest(w_idx, w_kind, w_scope, w_resource, w_amount) AS w(idx, kind, scope, resource, amount)
          WHERE w.idx = ANY (v_admitted)
          GROUP BY w.kind, w.scope, w.resource) AS s
    JOIN unnest(l_kind, l_scope, l_resource, l_tid) AS l(kind, scope, resource, tid)
      ON l.kind = s.kind AND l.scope = s.scope AND l.resource = s.resource;
    UPDATE quota_usages u SET in_use = u.in_use + d.di, reserved = u.reserved + d.dr, updated_at = v_now
    FROM unnest(v_tids, v_dis, v_drs) AS d(tid, di, dr) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_tids);
    RETURN QUERY SELECT v_now, n FROM unnest(v_admitted) AS n;
END
$$;
