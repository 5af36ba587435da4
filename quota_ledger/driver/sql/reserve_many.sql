-- quota_ledger_reserve_many(...): reservations of one partition decided together, as the
-- ledger's general path (its rule) would decide them one after another in the order given, with
-- one statement per step for all of them, for any number of requests, one included. Request i
-- (1-based) has the items, user/group counters and ResourceQuota charges whose owner is i, and,
-- when tracked, its user, application, app_key and group. A first use creates what it needs as
-- the general path does: a queue's counters, a new application's row (the request that starts
-- it counts against every maxapplications of its lineage and of its user and group) and
-- a user's or group's copies of a wildcard limit, valued from its application rows as they were
-- before the call. Set aside (declined) are: a request whose id or key exists, that names a
-- resource the partition names nowhere yet, whose application row is not running or not the
-- caller's, whose user/group or ResourceQuota counter is missing, a later request of a new
-- application whose first one is set aside (or differs from it), and one needing a copy that an
-- earlier request of the call could change. Of the others, the longest prefix whose running
-- totals stay within every counter is admitted; the first that would go over a limit (or the
-- bigint limit), and every one after it, is declined. Nothing of a declined request survives,
-- and the caller decides it alone. Another configuration version declines them all. Never
-- raises QL001. Returns (created_at, idx) for each admitted request.
-- Locks, in the canonical order: the partition (advisory, shared); the new reservation rows;
-- the application rows (app_key order, then the new ones); when user/group counters are
-- missing, the application rows of those users and groups (app_key order); then, after
-- inserting the missing counters, the counters, each looked up by its whole unique key in byte
-- order: the queues' own counters, the subtree counters of their lineages, the user and group
-- counters, the ResourceQuota counters.
CREATE OR REPLACE FUNCTION quota_ledger_reserve_many(
    p_partition text, p_version integer, p_lock_ns integer, p_lock_key integer,
    p_ids text[], p_keys text[], p_request_hashes text[], p_queues text[], p_groups text[],
    p_ttl_us bigint[], p_priority_classes text[], p_kubes text[],
    p_users text[], p_applications text[], p_app_keys text[], p_app_groups text[],
    p_item_owners integer[], p_item_resources text[], p_item_amounts bigint[],
    -- user/group counters: (owner, kind, name, queue, resource, amount, limit), an
    -- 'applications' one counting only for the request that starts the application
    p_id_owners integer[], p_id_kinds text[], p_id_names text[], p_id_queues text[], p_id_resources text[],
    p_id_amounts bigint[], p_id_limits bigint[],
    -- ResourceQuota charges: (owner, namespace/name, resource, amount)
    p_quota_owners integer[], p_quota_names text[], p_quota_resources text[], p_quota_amounts bigint[]
) RETURNS TABLE (created_at timestamp, idx integer)
LANGUAGE plpgsql
SET enable_seqscan = off  -- lookups by key only: a plan cached while a table was small must not scan it
SET plan_cache_mode = force_generic_plan  -- planned once per connection (see below)
AS $$
DECLARE
    v_now timestamp;
    v_inserted integer[];
    -- requests inserted but set aside
    v_aside integer[];
    -- whether an inserted request has an app_key; whether an inserted item had no queue
    -- counter; how many counters (other than subtree ones) were missing when locked
    v_tracked boolean := cardinality(array_remove(p_app_keys, NULL)) > 0;
    v_uncounted boolean;
    v_unfound integer;
    -- app keys no row had when locked; the rows this call inserted; the requests starting a
    -- named application
    v_fresh text[];
    v_new_keys text[];
    v_started integer[] := '{}';
    -- user/group counters this call created: (kind, name, queue, resource)
    c_kind text[];
    c_name text[];
    c_queue text[];
    c_resource text[];
    c_lim bigint[];
    c_tid tid[];
    -- the queue counters this call made: (address, queue, resource)
    q_tid tid[];
    q_scope text[];
    q_resource text[];
    v_admitted integer[];
    v_tids tid[];
    v_id_tids tid[];
    v_updated integer;
    v_id_updated integer;
    -- what each request charges: (request, kind, key, resource, amount); kind 0: a queue's own
    -- counter (k1 the queue), 1: a subtree counter (k1 the queue), 2: a user/group counter
    -- (k1..k3: kind, name, queue), 3: a ResourceQuota counter (k1..k3: 'quota', name, queue)
    w_idx integer[];
    w_kind integer[];
    w_k1 text[];
    w_k2 text[];
    w_k3 text[];
    w_resource text[];
    w_amount bigint[];
    -- the counters locked: (kind, key, resource, address, in use + reserved, cap)
    l_kind integer[];
    l_k1 text[];
    l_k2 text[];
    l_k3 text[];
    l_resource text[];
    l_tid tid[];
    l_used numeric[];
    l_cap numeric[];
BEGIN
    -- A call of up to 8 requests runs each statement's generic plan (planned once per
    -- connection): planning a custom plan for every statement of every call would cost more
    -- than running it. A larger call lets the plan cache choose, as for any statement (a custom
    -- plan hashes a lookup in an array of 9 elements or more).
    IF cardinality(p_ids) > 8 THEN
        PERFORM set_config('plan_cache_mode', 'auto', true);
    END IF;
    PERFORM pg_advisory_xact_lock_shared(p_lock_ns, p_lock_key);
    IF (SELECT version FROM quota_config_head WHERE id = 1) IS DISTINCT FROM p_version THEN
        RETURN;
    END IF;
    v_now := TIMEZONE('UTC', clock_timestamp());
    -- our own new rows first (an insert of the same key in flight makes us wait for it)
    WITH inserted AS (
        INSERT INTO reservations (id, "partition", "key", request_hash, state, queue, user_name, "groups",
                                  application, priority_class, created_at, expires_at, resolved_at, kube)
        SELECT t.id, p_partition, t.key, t.request_hash, 'pending', t.queue, t.user_name, t.groups,
               t.application, t.priority_class, v_now, v_now + t.ttl_us * interval '1 microsecond', NULL, t.kube
        FROM unnest(p_ids, p_keys, p_request_hashes, p_queues, p_groups, p_ttl_us, p_priority_classes, p_kubes,
                    p_users, p_applications)
             WITH ORDINALITY AS t(id, key, request_hash, queue, groups, ttl_us, priority_class, kube, user_name,
                                  application, n)
        ORDER BY t.n
        ON CONFLICT DO NOTHING
        RETURNING id)
    SELECT array_agg(t.n::integer) INTO v_inserted
    FROM inserted JOIN unnest(p_ids) WITH ORDINALITY AS t(id, n) ON t.id = inserted.id;
    IF v_inserted IS NULL THEN
        RETURN;
    END IF;
    -- A resource the partition names nowhere yet is left to the general path, which checks the
    -- partition's bound on distinct resource names. (An item whose queue counter exists names
    -- a resource the partition has: only the others are looked for among all its counters. And
    -- with every queue counter there, none is missing when the missing ones are made below: a
    -- counter goes only under the exclusive partition lock.)
    SELECT coalesce(array_agg(DISTINCT i.owner) FILTER (WHERE i.unknown), '{}'),
           coalesce(bool_or(NOT i.counted), false)
    INTO v_aside, v_uncounted
    FROM (SELECT i.owner, q.counted,
                 CASE WHEN q.counted THEN false
                      ELSE NOT EXISTS (SELECT 1 FROM quota_usages u
                                       WHERE u."partition" = p_partition AND u.resource = i.resource) END AS unknown
          FROM unnest(p_item_owners, p_item_resources) AS i(owner, resource)
          CROSS JOIN LATERAL (
              SELECT EXISTS (SELECT 1 FROM quota_usages u
                             WHERE u."partition" = p_partition AND u.scope_type = 'queue'
                               AND u.scope = p_queues[i.owner] AND u.resource = i.resource) AS counted) AS q
          WHERE i.owner = ANY (v_inserted)) AS i;
    IF v_tracked THEN
        v_tracked := EXISTS (SELECT 1 FROM unnest(v_inserted) AS n WHERE p_app_keys[n] IS NOT NULL);
    END IF;
    IF v_tracked THEN
        -- The application rows: those that exist are locked and must be running and the
        -- caller's; a new one is inserted for its first request (the one that starts it) and
        -- charged once the prefix admitted is known (removed again if that one is not). Each is
        -- looked up by its whole key.
        PERFORM 1
        FROM (SELECT p_app_keys[n] AS app_key FROM unnest(v_inserted) AS n
              WHERE p_app_keys[n] IS NOT NULL
              GROUP BY p_app_keys[n] ORDER BY p_app_keys[n] COLLATE "C") AS k
        CROSS JOIN LATERAL (
            SELECT 1 FROM quota_applications a
            WHERE a."partition" = p_partition AND a.app_key = k.app_key
            LIMIT 1 FOR UPDATE) AS a;
        v_aside := v_aside || ARRAY(
            SELECT n FROM unnest(v_inserted) AS n
            CROSS JOIN LATERAL (
                SELECT a.state, a.user_name, a.application, a.queue, a.group_name FROM quota_applications a
                WHERE a."partition" = p_partition AND a.app_key = p_app_keys[n]
                LIMIT 1) AS a
            WHERE a.state <> 'running' OR a.user_name IS DISTINCT FROM p_users[n]
               OR a.application IS DISTINCT FROM p_applications[n] OR a.queue <> p_queues[n]
               OR a.group_name IS DISTINCT FROM p_app_groups[n]);
        SELECT array_agg(DISTINCT p_app_keys[n]) INTO v_fresh
        FROM unnest(v_inserted) AS n
        WHERE p_app_keys[n] IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM quota_applications a WHERE a."partition" = p_partition AND a.app_key = p_app_keys[n]
            OFFSET 0);
        IF v_fresh IS NOT NULL THEN
            -- a later request of a new application must be for the same row as its first one
            v_aside := v_aside || ARRAY(
                SELECT n FROM unnest(v_inserted) AS n
                CROSS JOIN LATERAL (SELECT min(m) AS first FROM unnest(v_inserted) AS m
                                    WHERE p_app_keys[m] = p_app_keys[n]) AS s
                WHERE p_app_keys[n] = ANY (v_fresh) AND s.first <> n
                  AND (p_users[n] IS DISTINCT FROM p_users[s.first]
                       OR p_applications[n] IS DISTINCT FROM p_applications[s.first]
                       OR p_queues[n] <> p_queues[s.first]
                       OR p_app_groups[n] IS DISTINCT FROM p_app_groups[s.first]));
            WITH added AS (
                INSERT INTO quota_applications ("partition", app_key, application, user_name, queue, group_name,
                                                state, pending, "usage", area, submitted_at, started_at,
                                                finished_at, changed_at)
                SELECT p_partition, p_app_keys[s.first], p_applications[s.first], p_users[s.first],
                       p_queues[s.first], p_app_groups[s.first], 'running', 0, '{}', '{}', v_now, NULL, NULL, v_now
                FROM (SELECT min(n) AS first FROM unnest(v_inserted) AS n
                      WHERE p_app_keys[n] = ANY (v_fresh) GROUP BY p_app_keys[n]) AS s
                WHERE NOT s.first = ANY (v_aside)
                ORDER BY p_app_keys[s.first]
                ON CONFLICT DO NOTHING
                RETURNING app_key)
            SELECT array_agg(app_key) INTO v_new_keys FROM added;
            v_new_keys := coalesce(v_new_keys, '{}');
            -- a row another transaction inserted meanwhile, or whose first request is set aside
            v_aside := v_aside || ARRAY(
                SELECT n FROM unnest(v_inserted) AS n
                WHERE p_app_keys[n] = ANY (v_fresh) AND NOT p_app_keys[n] = ANY (v_new_keys));
            SELECT coalesce(array_agg(s.first), '{}') INTO v_started
            FROM (SELECT min(n) AS first FROM unnest(v_inserted) AS n
                  WHERE p_app_keys[n] = ANY (v_new_keys) GROUP BY p_app_keys[n]) AS s
            WHERE p_applications[s.first] IS NOT NULL;
        END IF;
    END IF;
    IF cardinality(p_id_owners) > 0 THEN
        -- A copy holds what the application rows held before the call. One after another, the
        -- request that makes it would see the changes of the requests before it: a request
        -- that comes after one that changes those rows without being charged to the copy is
        -- set aside.
        v_aside := v_aside || ARRAY(
            WITH wanted AS MATERIALIZED (
                SELECT t.owner, t.kind, t.name, t.queue, t.resource
                FROM unnest(p_id_owners, p_id_kinds, p_id_names, p_id_queues, p_id_resources)
                     AS t(owner, kind, name, queue, resource)
                WHERE t.owner = ANY (v_inserted) AND NOT t.owner = ANY (v_aside)
                  AND (t.resource <> 'applications' OR t.owner = ANY (v_started))),
            -- what each tracked request changes in its application row: (request, kind, name,
            -- queue, resource)
            touched AS (
                SELECT r.owner, k.kind, k.name, p_queues[r.owner] AS queue, r.resource
                FROM (SELECT i.owner, i.resource FROM unnest(p_item_owners, p_item_resources) AS i(owner, resource)
                      UNION ALL
                      SELECT s, 'applications' FROM unnest(v_started) AS s) AS r
                CROSS JOIN LATERAL (VALUES ('user', p_users[r.owner]), ('group', p_app_groups[r.owner])) AS k(kind, name)
                WHERE r.owner = ANY (v_inserted) AND NOT r.owner = ANY (v_aside)
                  AND p_app_keys[r.owner] IS NOT NULL AND k.name IS NOT NULL),
            -- each missing copy, and the first request that changes what it is made from
            gap AS (
                SELECT c.kind, c.name, c.queue, c.resource, min(t.owner) AS owner
                FROM (SELECT DISTINCT w.kind, w.name, w.queue, w.resource FROM wanted w
                      WHERE NOT EXISTS (
                          SELECT 1 FROM quota_identity_usages u
                          WHERE u."partition" = p_partition AND u.kind = w.kind AND u.name = w.name
                            AND u.queue = w.queue AND u.resource = w.resource
                          OFFSET 0)) AS c
                JOIN touched t ON t.kind = c.kind AND t.name = c.name AND t.resource = c.resource
                              AND (t.queue = c.queue OR starts_with(t.queue, c.queue || '.'))
                WHERE NOT EXISTS (
                    SELECT 1 FROM wanted w
                    WHERE w.owner = t.owner AND w.kind = c.kind AND w.name = c.name AND w.queue = c.queue
                      AND w.resource = c.resource)
                GROUP BY c.kind, c.name, c.queue, c.resource)
            SELECT DISTINCT w.owner FROM wanted w
            JOIN gap g ON g.kind = w.kind AND g.name = w.name AND g.queue = w.queue AND g.resource = w.resource
            WHERE w.owner > g.owner);
        -- the copies to make, each with the limit of its first request
        SELECT array_agg(m.kind), array_agg(m.name), array_agg(m.queue), array_agg(m.resource), array_agg(m.lim)
        INTO c_kind, c_name, c_queue, c_resource, c_lim
        FROM (SELECT DISTINCT ON (t.kind, t.name, t.queue, t.resource) t.kind, t.name, t.queue, t.resource, t.lim
              FROM unnest(p_id_owners, p_id_kinds, p_id_names, p_id_queues, p_id_resources, p_id_limits)
                   AS t(owner, kind, name, queue, resource, lim)
              WHERE t.owner = ANY (v_inserted) AND NOT t.owner = ANY (v_aside)
                AND (t.resource <> 'applications' OR t.owner = ANY (v_started))
                -- (OFFSET 0: a lookup by the whole key for each, never a join with the partition's
                -- counters, which the planner would pick thinking the arrays short)
                AND NOT EXISTS (
                  SELECT 1 FROM quota_identity_usages u
                  WHERE u."partition" = p_partition AND u.kind = t.kind AND u.name = t.name
                    AND u.queue = t.queue AND u.resource = t.resource
                  OFFSET 0)
              ORDER BY t.kind, t.name, t.queue, t.resource, t.owner) AS m;
        IF c_kind IS NOT NULL THEN
            -- those users' and groups' application rows first (a release of one is either in
            -- the values or waits), in app_key order, before any counter
            -- (each list an array, not a subquery: then each is an index condition)
            PERFORM 1 FROM quota_applications a
            WHERE a."partition" = p_partition
              AND (a.user_name = ANY (ARRAY(SELECT m.name FROM unnest(c_kind, c_name) AS m(kind, name)
                                            WHERE m.kind = 'user'))
                   OR a.group_name = ANY (ARRAY(SELECT m.name FROM unnest(c_kind, c_name) AS m(kind, name)
                                                WHERE m.kind = 'group')))
            ORDER BY a.app_key FOR UPDATE;
            WITH made AS (
                INSERT INTO quota_identity_usages ("partition", kind, name, queue, resource, in_use, reserved,
                                                   hard_limit, updated_at)
                SELECT p_partition, m.kind, m.name, m.queue, m.resource,
                       CASE WHEN m.resource = 'applications' THEN h.running ELSE h.in_use END,
                       CASE WHEN m.resource = 'applications' THEN 0 ELSE h.reserved END,
                       m.lim, v_now
                FROM unnest(c_kind, c_name, c_queue, c_resource, c_lim) AS m(kind, name, queue, resource, lim)
                CROSS JOIN LATERAL (
                    SELECT coalesce(sum((a."usage"::jsonb -> m.resource ->> 0)::bigint), 0) AS in_use,
                           coalesce(sum((a."usage"::jsonb -> m.resource ->> 1)::bigint), 0) AS reserved,
                           count(*) FILTER (WHERE a.application IS NOT NULL AND a.state = 'running') AS running
                    FROM quota_applications a
                    WHERE a."partition" = p_partition AND NOT a.app_key = ANY (coalesce(v_new_keys, '{}'))
                      AND ((m.kind = 'user' AND a.user_name = m.name) OR (m.kind = 'group' AND a.group_name = m.name))
                      AND (a.queue = m.queue OR starts_with(a.queue, m.queue || '.'))) AS h
                ORDER BY m.kind COLLATE "C", m.name COLLATE "C", m.queue COLLATE "C", m.resource COLLATE "C"
                ON CONFLICT DO NOTHING
                RETURNING ctid, kind, name, queue, resource)
            SELECT array_agg(made.ctid), array_agg(made.kind), array_agg(made.name), array_agg(made.queue),
                   array_agg(made.resource)
            INTO c_tid, c_kind, c_name, c_queue, c_resource
            FROM made;
        END IF;
    END IF;
    -- The queue counters missing are created before any counter is locked (then two first uses
    -- cannot deadlock).
    IF v_uncounted THEN
        v_uncounted := EXISTS (
            SELECT 1 FROM unnest(p_item_owners, p_item_resources) AS i(owner, resource)
            WHERE i.owner = ANY (v_inserted) AND NOT i.owner = ANY (v_aside)
              AND NOT EXISTS (
                SELECT 1 FROM quota_usages u
                WHERE u."partition" = p_partition AND u.scope_type = 'queue' AND u.scope = p_queues[i.owner]
                  AND u.resource = i.resource
                OFFSET 0));
    END IF;
    IF v_uncounted THEN
        INSERT INTO quota_partitions (name, created_at) VALUES (p_partition, v_now) ON CONFLICT DO NOTHING;
        WITH made AS (
            INSERT INTO quota_usages ("partition", scope_type, scope, resource, in_use, reserved, hard_limit,
                                      updated_at)
            SELECT p_partition, 'queue', m.queue, m.resource, 0, 0, NULL, v_now
            FROM (SELECT DISTINCT p_queues[i.owner] AS queue, i.resource
                  FROM unnest(p_item_owners, p_item_resources) AS i(owner, resource)
                  WHERE i.owner = ANY (v_inserted) AND NOT i.owner = ANY (v_aside)) AS m
            ORDER BY m.queue COLLATE "C", m.resource COLLATE "C"
            ON CONFLICT DO NOTHING
            RETURNING ctid, scope, resource)
        SELECT array_agg(made.ctid), array_agg(made.scope), array_agg(made.resource)
        INTO q_tid, q_scope, q_resource
        FROM made;
    END IF;
    -- What each request charges (a request that starts an application adds 'applications' to
    -- its lineage and its user/group counters).
    SELECT array_agg(w.idx), array_agg(w.kind), array_agg(w.k1), array_agg(w.k2), array_agg(w.k3),
           array_agg(w.resource), array_agg(w.amount)
    INTO w_idx, w_kind, w_k1, w_k2, w_k3, w_resource, w_amount
    FROM (
        SELECT i.owner AS idx, k.kind, k.scope AS k1, '' AS k2, '' AS k3, i.resource, i.amount
        FROM (SELECT t.*, false AS started
              FROM unnest(p_item_owners, p_item_resources, p_item_amounts) AS t(owner, resource, amount)
              UNION ALL
              SELECT s, 'applications', 1::bigint, true FROM unnest(v_started) AS s) AS i
        CROSS JOIN LATERAL (
            SELECT 0 AS kind, p_queues[i.owner] AS scope WHERE NOT i.started
            UNION ALL
            SELECT 1, s.scope FROM unnest(quota_ledger_lineage(p_queues[i.owner])) AS s(scope)) AS k
        WHERE i.owner = ANY (v_inserted) AND NOT i.owner = ANY (v_aside)
        UNION ALL
        SELECT t.owner, 2, t.kind, t.name, t.queue, t.resource, t.amount
        FROM unnest(p_id_owners, p_id_kinds, p_id_names, p_id_queues, p_id_resources, p_id_amounts)
             AS t(owner, kind, name, queue, resource, amount)
        WHERE t.owner = ANY (v_inserted) AND NOT t.owner = ANY (v_aside)
          AND (t.resource <> 'applications' OR t.owner = ANY (v_started))
        UNION ALL
        SELECT q.owner, 3, 'quota', q.name, p_queues[q.owner], q.resource, q.amount
        FROM unnest(p_quota_owners, p_quota_names, p_quota_resources, p_quota_amounts)
             AS q(owner, name, resource, amount)
        WHERE q.owner = ANY (v_inserted) AND NOT q.owner = ANY (v_aside)) AS w;
    IF w_idx IS NULL THEN
        DELETE FROM reservations r WHERE r.id = ANY (SELECT p_ids[n] FROM unnest(v_inserted) AS n);
        DELETE FROM quota_applications a WHERE a."partition" = p_partition AND a.app_key = ANY (v_new_keys);
        RETURN;
    END IF;
    -- The counters, each set in the canonical order and in byte order, each looked up and locked
    -- by its whole unique key (LATERAL runs per key, in order; LIMIT 1 keeps it a lookup): the
    -- queues' own and subtree counters, then the user/group and ResourceQuota counters.
    SELECT array_agg(c.kind) FILTER (WHERE c.tid IS NOT NULL), array_agg(c.k1) FILTER (WHERE c.tid IS NOT NULL),
           array_agg(c.k2) FILTER (WHERE c.tid IS NOT NULL), array_agg(c.k3) FILTER (WHERE c.tid IS NOT NULL),
           array_agg(c.resource) FILTER (WHERE c.tid IS NOT NULL), array_agg(c.tid) FILTER (WHERE c.tid IS NOT NULL),
           array_agg(c.used) FILTER (WHERE c.tid IS NOT NULL), array_agg(c.cap) FILTER (WHERE c.tid IS NOT NULL),
           count(*) FILTER (WHERE c.tid IS NULL AND c.kind <> 1)
    INTO l_kind, l_k1, l_k2, l_k3, l_resource, l_tid, l_used, l_cap, v_unfound
    FROM (
        SELECT w.kind, w.k1, w.k2, w.k3, w.resource, c.ctid AS tid, c.in_use::numeric + c.reserved AS used,
               CASE WHEN w.kind = 0 THEN 9223372036854775807
                    ELSE coalesce(c.hard_limit, 9223372036854775807) END::numeric AS cap
        FROM (SELECT t.kind, t.k1, t.k2, t.k3, t.resource
              FROM unnest(w_kind, w_k1, w_k2, w_k3, w_resource) AS t(kind, k1, k2, k3, resource)
              WHERE t.kind < 2
              GROUP BY t.kind, t.k1, t.k2, t.k3, t.resource
              ORDER BY t.kind, t.k1 COLLATE "C", t.resource COLLATE "C") AS w
        LEFT JOIN LATERAL (
            SELECT u.ctid, u.in_use, u.reserved, u.hard_limit FROM quota_usages u
            WHERE u."partition" = p_partition AND u.scope_type = CASE w.kind WHEN 0 THEN 'queue' ELSE 'subtree' END
              AND u.scope = w.k1 AND u.resource = w.resource
            LIMIT 1 FOR UPDATE) AS c ON true
        UNION ALL
        SELECT w.kind, w.k1, w.k2, w.k3, w.resource, c.ctid, c.in_use::numeric + c.reserved,
               coalesce(c.hard_limit, 9223372036854775807)::numeric
        FROM (SELECT t.kind, t.k1, t.k2, t.k3, t.resource
              FROM unnest(w_kind, w_k1, w_k2, w_k3, w_resource) AS t(kind, k1, k2, k3, resource)
              WHERE t.kind >= 2
              GROUP BY t.kind, t.k1, t.k2, t.k3, t.resource
              ORDER BY t.kind, t.k1 COLLATE "C", t.k2 COLLATE "C", t.k3 COLLATE "C", t.resource COLLATE "C") AS w
        LEFT JOIN LATERAL (
            SELECT u.ctid, u.in_use, u.reserved, u.hard_limit FROM quota_identity_usages u
            WHERE u."partition" = p_partition AND u.kind = w.k1 AND u.name = w.k2 AND u.queue = w.k3
              AND u.resource = w.resource
            LIMIT 1 FOR UPDATE) AS c ON true) AS c;
    -- a request whose own, user/group or ResourceQuota counter is missing still is set aside
    -- too, and so are the later requests of an application its first one would have started
    IF v_unfound > 0 THEN
        v_aside := v_aside || ARRAY(
            SELECT DISTINCT w.idx
            FROM unnest(w_idx, w_kind, w_k1, w_k2, w_k3, w_resource) AS w(idx, kind, k1, k2, k3, resource)
            WHERE w.kind <> 1 AND NOT EXISTS (
                SELECT 1 FROM unnest(l_kind, l_k1, l_k2, l_k3, l_resource) AS l(kind, k1, k2, k3, resource)
                WHERE l.kind = w.kind AND l.k1 = w.k1 AND l.k2 = w.k2 AND l.k3 = w.k3 AND l.resource = w.resource));
    END IF;
    IF cardinality(v_new_keys) > 0 THEN
        v_aside := v_aside || ARRAY(
            SELECT n FROM unnest(v_inserted) AS n
            WHERE p_app_keys[n] = ANY (v_new_keys) AND (
                SELECT min(m) FROM unnest(v_inserted) AS m WHERE p_app_keys[m] = p_app_keys[n]) = ANY (v_aside));
    END IF;
    -- of the others, those before the first that would take a counter over its cap
    WITH over AS (
        SELECT min(r.idx) AS first
        FROM (SELECT w.idx, w.kind, w.k1, w.k2, w.k3, w.resource,
                     sum(w.amount) OVER (PARTITION BY w.kind, w.k1, w.k2, w.k3, w.resource ORDER BY w.idx) AS total
              FROM unnest(w_idx, w_kind, w_k1, w_k2, w_k3, w_resource, w_amount)
                   AS w(idx, kind, k1, k2, k3, resource, amount)
              WHERE NOT w.idx = ANY (v_aside)) AS r
        JOIN unnest(l_kind, l_k1, l_k2, l_k3, l_resource, l_used, l_cap) AS l(kind, k1, k2, k3, resource, used, cap)
          ON l.kind = r.kind AND l.k1 = r.k1 AND l.k2 = r.k2 AND l.k3 = r.k3 AND l.resource = r.resource
        WHERE l.used + r.total > l.cap)
    SELECT coalesce(array_agg(n ORDER BY n), '{}') INTO v_admitted
    FROM unnest(v_inserted) AS n CROSS JOIN over
    WHERE NOT n = ANY (v_aside) AND (over.first IS NULL OR n < over.first);
    IF cardinality(v_admitted) < cardinality(v_inserted) THEN
        DELETE FROM reservations r
        WHERE r.id = ANY (SELECT p_ids[n] FROM unnest(v_inserted) AS n WHERE NOT n = ANY (v_admitted));
    END IF;
    IF cardinality(v_new_keys) > 0 AND cardinality(v_admitted) < cardinality(v_inserted) THEN
        -- the rows of applications no admitted request starts (with every request admitted,
        -- each new row has its first request among them)
        DELETE FROM quota_applications a
        WHERE a."partition" = p_partition AND a.app_key = ANY (v_new_keys)
          -- (only the admitted requests' keys: one without an application has none, and a
          -- NULL in the list would make the test NULL and keep the row)
          AND NOT a.app_key = ANY (SELECT p_app_keys[n] FROM unnest(v_admitted) AS n
                                   WHERE p_app_keys[n] IS NOT NULL);
    END IF;
    IF c_tid IS NOT NULL THEN
        -- and the copies no admitted request is charged to (by their addresses: rows this
        -- call inserted and has not updated)
        DELETE FROM quota_identity_usages u
        WHERE u.ctid = ANY (ARRAY(
            SELECT c.tid FROM unnest(c_tid, c_kind, c_name, c_queue, c_resource) AS c(tid, kind, name, queue, resource)
            WHERE NOT EXISTS (
                SELECT 1 FROM unnest(w_idx, w_kind, w_k1, w_k2, w_k3, w_resource)
                     AS w(idx, kind, k1, k2, k3, resource)
                WHERE w.kind = 2 AND w.k1 = c.kind AND w.k2 = c.name AND w.k3 = c.queue AND w.resource = c.resource
                  AND w.idx = ANY (v_admitted))));
    END IF;
    IF q_tid IS NOT NULL THEN
        -- and the queue counters this call made that no admitted request is charged to (a
        -- refused first use leaves nothing behind)
        DELETE FROM quota_usages u
        WHERE u.ctid = ANY (ARRAY(
            SELECT q.tid FROM unnest(q_tid, q_scope, q_resource) AS q(tid, scope, resource)
            WHERE NOT EXISTS (
                SELECT 1 FROM unnest(v_admitted) AS n
                JOIN unnest(p_item_owners, p_item_resources) AS i(owner, resource) ON i.owner = n
                WHERE p_queues[n] = q.scope AND i.resource = q.resource)));
    END IF;
    IF cardinality(v_admitted) = 0 THEN
        RETURN;
    END IF;
    -- each application row once: its admitted requests' items reserved, each pending
    IF v_tracked THEN
        v_tracked := EXISTS (SELECT 1 FROM unnest(v_admitted) AS n WHERE p_app_keys[n] IS NOT NULL);
    END IF;
    IF v_tracked THEN
        UPDATE quota_applications a SET "usage" = d.usage::text, pending = a.pending + d.n
        FROM (SELECT a2.id, s.n,
                     a2."usage"::jsonb || coalesce((
                         SELECT jsonb_object_agg(i.resource, jsonb_build_array(
                                    coalesce((a2."usage"::jsonb -> i.resource ->> 0)::bigint, 0),
                                    coalesce((a2."usage"::jsonb -> i.resource ->> 1)::bigint, 0) + i.amount))
                         FROM (SELECT t.resource, sum(t.amount)::bigint AS amount
                               FROM unnest(p_item_owners, p_item_resources, p_item_amounts) AS t(owner, resource, amount)
                               WHERE t.owner = ANY (v_admitted) AND p_app_keys[t.owner] = a2.app_key
                               GROUP BY t.resource) AS i), '{}'::jsonb) AS usage
              FROM (SELECT p_app_keys[n] AS app_key, count(*)::integer AS n FROM unnest(v_admitted) AS n
                    WHERE p_app_keys[n] IS NOT NULL GROUP BY p_app_keys[n]) AS s
              CROSS JOIN LATERAL (
                  SELECT a2.id, a2.app_key, a2."usage" FROM quota_applications a2
                  WHERE a2."partition" = p_partition AND a2.app_key = s.app_key
                  LIMIT 1) AS a2) AS d
        WHERE a.id = d.id;
    END IF;
    -- the admitted requests' items, and every counter charged once with their sum (a
    -- running-application count is in use at once, and so is a ResourceQuota charge; resources
    -- are reserved) at its address (a row we hold locked cannot move)
    WITH itemized AS (
        INSERT INTO reservation_items (reservation_id, resource, amount)
        SELECT p_ids[i.owner], i.resource, i.amount
        FROM unnest(p_item_owners, p_item_resources, p_item_amounts) AS i(owner, resource, amount)
        WHERE i.owner = ANY (v_admitted)),
    charges AS MATERIALIZED (
        SELECT l.kind, l.tid,
               CASE WHEN l.kind = 3 OR (l.kind > 0 AND l.resource = 'applications') THEN s.amount ELSE 0 END AS di,
               CASE WHEN l.kind = 3 OR (l.kind > 0 AND l.resource = 'applications') THEN 0 ELSE s.amount END AS dr
        FROM (SELECT w.kind, w.k1, w.k2, w.k3, w.resource, sum(w.amount)::bigint AS amount
              FROM unnest(w_idx, w_kind, w_k1, w_k2, w_k3, w_resource, w_amount)
                   AS w(idx, kind, k1, k2, k3, resource, amount)
              WHERE w.idx = ANY (v_admitted)
              GROUP BY w.kind, w.k1, w.k2, w.k3, w.resource) AS s
        JOIN unnest(l_kind, l_k1, l_k2, l_k3, l_resource, l_tid) AS l(kind, k1, k2, k3, resource, tid)
          ON l.kind = s.kind AND l.k1 = s.k1 AND l.k2 = s.k2 AND l.k3 = s.k3 AND l.resource = s.resource),
    counted AS (
        UPDATE quota_usages u SET in_use = u.in_use + d.di, reserved = u.reserved + d.dr, updated_at = v_now
        FROM charges d WHERE d.kind < 2 AND u.ctid = d.tid
        RETURNING 1),
    identified AS (
        UPDATE quota_identity_usages u SET in_use = u.in_use + d.di, reserved = u.reserved + d.dr,
                                           updated_at = v_now
        FROM charges d WHERE d.kind >= 2 AND u.ctid = d.tid
        RETURNING 1)
    SELECT array_agg(d.tid) FILTER (WHERE d.kind < 2), array_agg(d.tid) FILTER (WHERE d.kind >= 2),
           (SELECT count(*) FROM counted), (SELECT count(*) FROM identified)
    INTO v_tids, v_id_tids, v_updated, v_id_updated
    FROM charges d;
    PERFORM quota_ledger_check_updated(v_updated, v_tids);
    IF v_id_tids IS NOT NULL THEN
        PERFORM quota_ledger_check_updated(v_id_updated, v_id_tids);
    END IF;
    RETURN QUERY SELECT v_now, n FROM unnest(v_admitted) AS n;
END
$$;
