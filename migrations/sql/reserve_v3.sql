-- quota_ledger_reserve(...): a reservation in one statement: the reservation row and its items,
-- the application's reserved usage when the request is tracked, and a charge to every counter it
-- is checked against (queue, lineage limits, user and group, ResourceQuota). A first use creates
-- what it needs as the general path does: the queue's counters, a new application's row (which
-- then counts against every maxapplications on its way to root, and its user's and group's) and
-- a user's copies of a wildcard limit, valued from that user's application rows. Whatever it
-- cannot do (a limit exceeded, a resource the partition does not name yet, an application that
-- is finished or not the caller's, another configuration version) it declines (QL001) before
-- any change survives. Returns the reservation's creation time.
-- Locks, in the canonical order: the partition (advisory, shared, in quota_ledger_enter); the new
-- reservation row (an insert of the same key in flight makes it wait); the application row;
-- when user/group counters are missing, the application rows of those users and groups (by
-- app_key); then, after inserting the missing counters and before locking any counter, the
-- counters, each looked up by its whole unique key in byte order: the queue's own, the
-- subtree counters of its lineage, the user and group counters, the ResourceQuota counters.
CREATE OR REPLACE FUNCTION quota_ledger_reserve(
    p_id text, p_partition text, p_key text, p_request_hash text, p_queue text,
    p_resources text[], p_amounts bigint[], p_ttl_us bigint, p_priority_class text, p_kube text,
    p_version integer, p_lock_ns integer, p_lock_key integer,
    -- the ResourceQuota counters the request is charged to: (namespace/name, resource, amount)
    p_quota_names text[], p_quota_resources text[], p_quota_amounts bigint[],
    -- a tracked request: its identity, its application row (which must be running, with the
    -- group the caller expects) and the user/group counters that enforce it
    p_user text, p_groups text, p_application text, p_app_key text, p_group text,
    -- (its 'applications' counters count only when the request starts a new application, and
    -- the limits are those a missing counter is created with)
    p_id_kinds text[], p_id_names text[], p_id_queues text[], p_id_resources text[], p_id_amounts bigint[],
    p_id_limits bigint[]
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
    -- the request starts a named application: it counts against every maxapplications
    v_started boolean := false;
    v_limited text[] := p_resources;
    v_limited_amounts bigint[] := p_amounts;
    -- the user/group counters to create: (kind, name, queue, resource, amount, limit)
    v_m_kinds text[];
    v_m_names text[];
    v_m_queues text[];
    v_m_resources text[];
    v_m_amounts bigint[];
    v_m_limits bigint[];
    v_usage jsonb;
    v_slot jsonb;
    v_tids tid[];
    v_dis bigint[];
    v_drs bigint[];
    v_id_tids tid[];
    v_id_dis bigint[];
    v_id_drs bigint[];
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
    -- the application row: a running application adds the request to its reserved usage; a
    -- new one starts running with it (a concurrent first use of the same application inserts
    -- first: its row is then locked and used as a running one)
    IF p_app_key IS NOT NULL THEN
        SELECT * INTO v_app FROM quota_applications
        WHERE "partition" = p_partition AND app_key = p_app_key FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO quota_applications ("partition", app_key, application, user_name, queue, group_name,
                                            state, pending, "usage", area, submitted_at, started_at,
                                            finished_at, changed_at)
            SELECT p_partition, p_app_key, p_application, p_user, p_queue, p_group, 'running', 1,
                   jsonb_object_agg(t.resource, jsonb_build_array(0, t.amount))::text, '{}', v_now, NULL,
                   NULL, v_now
            FROM unnest(p_resources, p_amounts) AS t(resource, amount)
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                v_started := p_application IS NOT NULL;
            ELSE
                SELECT * INTO v_app FROM quota_applications
                WHERE "partition" = p_partition AND app_key = p_app_key FOR UPDATE;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'an application row came and went' USING ERRCODE = 'QL001';
                END IF;
            END IF;
        END IF;
        IF v_app.id IS NOT NULL THEN
            IF v_app.state <> 'running' OR v_app.user_name IS DISTINCT FROM p_user
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
    END IF;
    IF v_started THEN
        v_limited := v_limited || 'applications'::text;
        v_limited_amounts := v_limited_amounts || 1::bigint;
    END IF;
    -- A user's copy of a wildcard limit is made when it is first needed, holding what the
    -- application rows of that user (or group) below its queue hold besides this request:
    -- those rows are locked first (so a release of one either is in the values or waits for
    -- them), in app_key order, before any counter.
    SELECT array_agg(t.kind), array_agg(t.name), array_agg(t.queue), array_agg(t.resource),
           array_agg(t.amount), array_agg(t.lim)
    INTO v_m_kinds, v_m_names, v_m_queues, v_m_resources, v_m_amounts, v_m_limits
    FROM unnest(p_id_kinds, p_id_names, p_id_queues, p_id_resources, p_id_amounts, p_id_limits)
         AS t(kind, name, queue, resource, amount, lim)
    -- (OFFSET 0: a lookup by the whole key for each, never an anti-join with every counter of
    -- the partition, which a plan made for a short array would pick)
    WHERE (t.resource <> 'applications' OR v_started) AND NOT EXISTS (
        SELECT 1 FROM quota_identity_usages u
        WHERE u."partition" = p_partition AND u.kind = t.kind AND u.name = t.name AND u.queue = t.queue
          AND u.resource = t.resource
        OFFSET 0);
    IF v_m_kinds IS NOT NULL THEN
        PERFORM 1 FROM quota_applications a
        WHERE a."partition" = p_partition
          AND (a.user_name = ANY (SELECT m.name FROM unnest(v_m_kinds, v_m_names) AS m(kind, name)
                                  WHERE m.kind = 'user')
               OR a.group_name = ANY (SELECT m.name FROM unnest(v_m_kinds, v_m_names) AS m(kind, name)
                                      WHERE m.kind = 'group'))
        ORDER BY a.app_key FOR UPDATE;
    END IF;
    -- New counters before any counter is locked: then two first uses cannot deadlock (an
    -- insert waits only for a concurrent inserter of the same row, which holds no counter).
    IF EXISTS (
        SELECT 1 FROM unnest(p_resources) AS t(resource)
        WHERE NOT EXISTS (
            SELECT 1 FROM quota_usages u
            WHERE u."partition" = p_partition AND u.scope_type = 'queue' AND u.scope = p_queue
              AND u.resource = t.resource
            OFFSET 0)) THEN
        -- a resource the partition names nowhere yet is left to the general path, which
        -- checks the partition's bound on distinct resource names
        IF EXISTS (
            SELECT 1 FROM unnest(p_resources) AS t(resource)
            WHERE NOT EXISTS (
                SELECT 1 FROM quota_usages u WHERE u."partition" = p_partition AND u.resource = t.resource)) THEN
            RAISE EXCEPTION 'a resource new to the partition' USING ERRCODE = 'QL001';
        END IF;
        INSERT INTO quota_partitions (name, created_at) VALUES (p_partition, v_now) ON CONFLICT DO NOTHING;
        INSERT INTO quota_usages ("partition", scope_type, scope, resource, in_use, reserved, hard_limit, updated_at)
        SELECT p_partition, 'queue', p_queue, t.resource, 0, 0, NULL, v_now
        FROM unnest(p_resources) AS t(resource) ORDER BY t.resource COLLATE "C"
        ON CONFLICT DO NOTHING;
    END IF;
    IF v_m_kinds IS NOT NULL THEN
        INSERT INTO quota_identity_usages ("partition", kind, name, queue, resource, in_use, reserved,
                                           hard_limit, updated_at)
        SELECT p_partition, m.kind, m.name, m.queue, m.resource,
               CASE WHEN m.resource = 'applications' THEN h.running - m.amount ELSE h.in_use END,
               CASE WHEN m.resource = 'applications' THEN 0 ELSE h.reserved - m.amount END,
               m.lim, v_now
        FROM unnest(v_m_kinds, v_m_names, v_m_queues, v_m_resources, v_m_amounts, v_m_limits)
             AS m(kind, name, queue, resource, amount, lim)
        CROSS JOIN LATERAL (
            SELECT coalesce(sum((a."usage"::jsonb -> m.resource ->> 0)::bigint), 0) AS in_use,
                   coalesce(sum((a."usage"::jsonb -> m.resource ->> 1)::bigint), 0) AS reserved,
                   count(*) FILTER (WHERE a.application IS NOT NULL AND a.state = 'running') AS running
            FROM quota_applications a
            WHERE a."partition" = p_partition
              AND ((m.kind = 'user' AND a.user_name = m.name) OR (m.kind = 'group' AND a.group_name = m.name))
              AND (a.queue = m.queue OR starts_with(a.queue, m.queue || '.'))) AS h
        ORDER BY m.kind COLLATE "C", m.name COLLATE "C", m.queue COLLATE "C", m.resource COLLATE "C"
        ON CONFLICT DO NOTHING;
    END IF;
    -- The shared counters, each set in the canonical order: the queue's own, the limits on its
    -- lineage, the user/group counters, the ResourceQuota counters. The wanted keys are sorted
    -- (byte order, as the columns' "C" collation sorts) and each is looked up and locked by its
    -- whole unique key in that order (LATERAL runs per key, in order; LIMIT 1 keeps it a
    -- lookup whatever the statistics say). Every update goes to the locked row's address. A
    -- running-application count is in use at once; resources are reserved.
    SELECT count(*), count(*) FILTER (WHERE c.in_use::numeric + c.reserved + c.amount > 9223372036854775807),
           array_agg(c.ctid), array_agg(0::bigint), array_agg(c.amount)
    INTO v_count, v_broken, v_tids, v_dis, v_drs
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
           v_tids || array_agg(c.ctid),
           v_dis || array_agg(CASE WHEN c.resource = 'applications' THEN c.amount ELSE 0 END),
           v_drs || array_agg(CASE WHEN c.resource = 'applications' THEN 0 ELSE c.amount END)
    INTO v_broken, v_tids, v_dis, v_drs
    FROM (SELECT s.scope, t.resource, t.amount
          FROM unnest(v_scopes) AS s(scope) CROSS JOIN unnest(v_limited, v_limited_amounts) AS t(resource, amount)
          ORDER BY s.scope COLLATE "C", t.resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, u.resource, u.in_use, u.reserved, u.hard_limit, w.amount FROM quota_usages u
        WHERE u."partition" = p_partition AND u.scope_type = 'subtree' AND u.scope = w.scope
          AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    IF v_broken > 0 THEN
        RAISE EXCEPTION 'over a limit' USING ERRCODE = 'QL001';
    END IF;
    IF cardinality(p_id_kinds) > 0 THEN
        SELECT count(*), count(*) FILTER (WHERE c.in_use::numeric + c.reserved + c.amount > c.hard_limit),
               array_agg(c.ctid),
               array_agg(CASE WHEN c.resource = 'applications' THEN c.amount ELSE 0 END),
               array_agg(CASE WHEN c.resource = 'applications' THEN 0 ELSE c.amount END)
        INTO v_count, v_broken, v_id_tids, v_id_dis, v_id_drs
        FROM (SELECT t.* FROM unnest(p_id_kinds, p_id_names, p_id_queues, p_id_resources, p_id_amounts)
                AS t(kind, name, queue, resource, amount)
              WHERE t.resource <> 'applications' OR v_started
              ORDER BY t.kind COLLATE "C", t.name COLLATE "C", t.queue COLLATE "C",
                       t.resource COLLATE "C") AS w
        CROSS JOIN LATERAL (
            SELECT u.ctid, u.resource, u.in_use, u.reserved, u.hard_limit, w.amount FROM quota_identity_usages u
            WHERE u."partition" = p_partition AND u.kind = w.kind AND u.name = w.name
              AND u.queue = w.queue AND u.resource = w.resource
            LIMIT 1 FOR UPDATE) AS c;
        IF v_count < (SELECT count(*) FROM unnest(p_id_resources) AS t(resource)
                      WHERE t.resource <> 'applications' OR v_started) OR v_broken > 0 THEN
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
    UPDATE quota_usages u SET in_use = u.in_use + d.di, reserved = u.reserved + d.dr, updated_at = v_now
    FROM unnest(v_tids, v_dis, v_drs) AS d(tid, di, dr) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_tids);
    UPDATE quota_identity_usages u SET in_use = u.in_use + d.di, reserved = u.reserved + d.dr, updated_at = v_now
    FROM unnest(v_id_tids, v_id_dis, v_id_drs) AS d(tid, di, dr) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_id_tids);
    UPDATE quota_identity_usages u SET in_use = u.in_use + d.amount, updated_at = v_now
    FROM unnest(v_quota_tids, v_quota_deltas) AS d(tid, amount) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_quota_tids);
    RETURN v_now;
END
$$;
