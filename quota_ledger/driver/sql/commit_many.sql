-- quota_ledger_commit_many(ids, operation ids, guard): commits pending reservations whole, and
-- leaves exactly the rows the general path would leave committing them one after another in
-- call order at one instant, with one statement per step for all of them: their states and
-- items, their journal rows, every counter (reserved -> in_use, each counter once with the sum)
-- and, for the tracked ones (a user or an application), each application row once (its in-use
-- area integrated up to now, then its reservations' usage moved from reserved to in use) and the
-- identity counters on the lineage of its user and group. Declined, and left to the caller
-- alone: an id that is not a pending reservation in time, a repeat of an id already in the
-- call, one with nothing reserved, a tracked one whose application row is missing (without
-- p_guard that aborts the call with QL001), and every one when a counter or an application's
-- usage would pass the bigint limit. Returns the committed reservation's row and idx (1-based)
-- for each committed reservation.
-- Locks the reservation rows in byte order of their ids; then the application rows by
-- (partition, app_key); then the counters, each looked up by its whole unique key in byte order:
-- the queues' own counters, the subtree counters of their lineages (by partition, scope,
-- resource), then the identity counters (by partition, kind, name, queue, resource). No
-- partition lock.
CREATE OR REPLACE FUNCTION quota_ledger_commit_many(p_ids text[], p_operation_ids text[], p_guard boolean)
RETURNS TABLE ("partition" text, "key" text, queue text, user_name text, "groups" text,
               application text, priority_class text, created_at timestamp, expires_at timestamp,
               resolved_at timestamp, resources text[], amounts bigint[], idx integer)
LANGUAGE plpgsql
SET enable_seqscan = off  -- lookups by key only: a plan cached while a table was small must not scan it
SET plan_cache_mode = force_generic_plan  -- planned once per connection (see below)
AS $$
DECLARE
    v_now timestamp;
    -- the reservations to commit, in call order: their places in the call, ids and columns, and
    -- a tracked one's app_key
    v_ns integer[];
    v_ids text[];
    v_parts text[];
    v_queues text[];
    v_keys text[];
    r_keys text[];
    r_users text[];
    r_groups text[];
    r_applications text[];
    r_priority_classes text[];
    r_created timestamp[];
    r_expires timestamp[];
    -- their items, read once, in that order and each reservation's in resource order: (place,
    -- partition, queue, resource, amount)
    i_ns integer[];
    i_parts text[];
    i_queues text[];
    i_resources text[];
    i_amounts bigint[];
    v_app_parts text[];
    v_app_keys text[];
    v_missing integer;
    v_broken integer;
    v_tids tid[];
    v_deltas bigint[];
    v_id_tids tid[];
    v_id_deltas bigint[];
    v_updated integer;
BEGIN
    -- A call of up to 8 reservations runs each statement's generic plan (planned once per
    -- connection): planning a custom plan for every statement of every call would cost more
    -- than running it. A larger call lets the plan cache choose, as for any statement (a custom
    -- plan hashes a lookup in an array of 9 elements or more).
    IF cardinality(p_ids) > 8 THEN
        PERFORM set_config('plan_cache_mode', 'auto', true);
    END IF;
    v_now := TIMEZONE('UTC', clock_timestamp());
    -- every row locked first, in id order; the first occurrence of each id that is pending and
    -- in time, and has items, is committed; its row and its items are read here once
    WITH locked AS (
        SELECT r.id, r."partition", r."key", r.state, r.queue, r.user_name, r."groups", r.application,
               r.priority_class, r.created_at, r.expires_at
        FROM reservations r
        WHERE r.id = ANY (p_ids) ORDER BY r.id COLLATE "C" FOR UPDATE),
    firsts AS (
        SELECT t.id, min(t.n)::integer AS n FROM unnest(p_ids) WITH ORDINALITY AS t(id, n) GROUP BY t.id),
    pending AS MATERIALIZED (
        SELECT f.n, l.* FROM locked l JOIN firsts f ON f.id = l.id
        WHERE l.state = 'pending' AND v_now < l.expires_at),
    items AS MATERIALIZED (
        SELECT p.n, p."partition", p.queue, i.resource, i.amount
        FROM pending p JOIN reservation_items i ON i.reservation_id = p.id
        ORDER BY p.n, i.resource)
    SELECT array_agg(c.n), array_agg(c.id), array_agg(c."partition"), array_agg(c.queue),
           array_agg(CASE WHEN c.user_name IS NOT NULL OR c.application IS NOT NULL
                          THEN coalesce(c.application, E'\t' || c.user_name || E'\t' || c.queue) END),
           array_agg(c."key"), array_agg(c.user_name), array_agg(c."groups"), array_agg(c.application),
           array_agg(c.priority_class), array_agg(c.created_at), array_agg(c.expires_at),
           (SELECT array_agg(i.n) FROM items i), (SELECT array_agg(i."partition") FROM items i),
           (SELECT array_agg(i.queue) FROM items i), (SELECT array_agg(i.resource) FROM items i),
           (SELECT array_agg(i.amount) FROM items i)
    INTO v_ns, v_ids, v_parts, v_queues, v_keys, r_keys, r_users, r_groups, r_applications,
         r_priority_classes, r_created, r_expires, i_ns, i_parts, i_queues, i_resources, i_amounts
    FROM (SELECT p.* FROM pending p WHERE EXISTS (SELECT 1 FROM items i WHERE i.n = p.n) ORDER BY p.n) AS c;
    IF v_ns IS NULL THEN
        RETURN;
    END IF;
    IF cardinality(array_remove(v_keys, NULL)) > 0 THEN
        -- the tracked ones' application rows, each once, by their whole unique key in byte order
        SELECT array_agg(w.part), array_agg(w.app_key)
        INTO v_app_parts, v_app_keys
        FROM (SELECT t.part, t.app_key FROM unnest(v_parts, v_keys) AS t(part, app_key)
              WHERE t.app_key IS NOT NULL
              GROUP BY t.part, t.app_key
              ORDER BY t.part COLLATE "C", t.app_key COLLATE "C") AS w
        CROSS JOIN LATERAL (
            SELECT a.id FROM quota_applications a
            WHERE a."partition" = w.part AND a.app_key = w.app_key
            LIMIT 1 FOR UPDATE) AS a;
        -- a tracked one without its application row is declined before anything is written for it
        SELECT count(*) INTO v_missing
        FROM unnest(v_parts, v_keys) AS t(part, app_key)
        WHERE t.app_key IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM unnest(v_app_parts, v_app_keys) AS a(part, app_key)
                          WHERE a.part = t.part AND a.app_key = t.app_key);
        IF v_missing > 0 THEN
            IF NOT p_guard THEN
                RAISE EXCEPTION 'no application row' USING ERRCODE = 'QL001';
            END IF;
            SELECT array_agg(t.n ORDER BY t.n), array_agg(t.id ORDER BY t.n), array_agg(t.part ORDER BY t.n),
                   array_agg(t.queue ORDER BY t.n), array_agg(t.app_key ORDER BY t.n),
                   array_agg(t.key ORDER BY t.n), array_agg(t.user_name ORDER BY t.n),
                   array_agg(t.groups ORDER BY t.n), array_agg(t.application ORDER BY t.n),
                   array_agg(t.priority_class ORDER BY t.n), array_agg(t.created_at ORDER BY t.n),
                   array_agg(t.expires_at ORDER BY t.n)
            INTO v_ns, v_ids, v_parts, v_queues, v_keys, r_keys, r_users, r_groups, r_applications,
                 r_priority_classes, r_created, r_expires
            FROM unnest(v_ns, v_ids, v_parts, v_queues, v_keys, r_keys, r_users, r_groups, r_applications,
                        r_priority_classes, r_created, r_expires)
                 AS t(n, id, part, queue, app_key, key, user_name, groups, application, priority_class,
                      created_at, expires_at)
            WHERE t.app_key IS NULL
               OR EXISTS (SELECT 1 FROM unnest(v_app_parts, v_app_keys) AS a(part, app_key)
                          WHERE a.part = t.part AND a.app_key = t.app_key);
            IF v_ns IS NULL THEN
                RETURN;
            END IF;
            SELECT array_agg(i.n ORDER BY i.o), array_agg(i.part ORDER BY i.o), array_agg(i.queue ORDER BY i.o),
                   array_agg(i.resource ORDER BY i.o), array_agg(i.amount ORDER BY i.o)
            INTO i_ns, i_parts, i_queues, i_resources, i_amounts
            FROM unnest(i_ns, i_parts, i_queues, i_resources, i_amounts) WITH ORDINALITY
                 AS i(n, part, queue, resource, amount, o)
            WHERE i.n = ANY (v_ns);
        END IF;
    END IF;
    -- the counters in the canonical order, each charged once with the sum
    SELECT count(*) FILTER (WHERE c.in_use::numeric + w.amount > 9223372036854775807),
           array_agg(c.ctid), array_agg(w.amount)
    INTO v_broken, v_tids, v_deltas
    FROM (SELECT k.kind, i.part, k.scope, i.resource, sum(i.amount)::bigint AS amount
          FROM unnest(i_parts, i_queues, i_resources, i_amounts) AS i(part, queue, resource, amount)
          CROSS JOIN LATERAL (
              SELECT 0 AS kind, i.queue AS scope
              UNION ALL
              SELECT 1, s.scope FROM unnest(quota_ledger_lineage(i.queue)) AS s(scope)) AS k
          GROUP BY k.kind, i.part, k.scope, i.resource
          ORDER BY k.kind, i.part COLLATE "C", k.scope COLLATE "C", i.resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, u.in_use FROM quota_usages u
        WHERE u."partition" = w.part
          AND u.scope_type = CASE w.kind WHEN 0 THEN 'queue' ELSE 'subtree' END
          AND u.scope = w.scope AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    IF v_app_keys IS NOT NULL THEN
        -- the users' and the applications' groups' counters on the lineage (as named by the
        -- application row, as the general path does)
        SELECT v_broken + count(*) FILTER (WHERE c.in_use::numeric + w.amount > 9223372036854775807),
               array_agg(c.ctid), array_agg(w.amount)
        INTO v_broken, v_id_tids, v_id_deltas
        FROM (SELECT p.part, k.kind, k.name, s.queue, i.resource, sum(i.amount)::bigint AS amount
              FROM unnest(v_ns, v_parts, v_queues, v_keys) AS p(n, part, queue, app_key)
              CROSS JOIN LATERAL (
                  SELECT a.user_name, a.group_name FROM quota_applications a
                  WHERE a."partition" = p.part AND a.app_key = p.app_key
                  LIMIT 1) AS a
              JOIN unnest(i_ns, i_resources, i_amounts) AS i(n, resource, amount) ON i.n = p.n
              CROSS JOIN LATERAL (VALUES ('user', a.user_name), ('group', a.group_name)) AS k(kind, name)
              CROSS JOIN unnest(quota_ledger_lineage(p.queue)) AS s(queue)
              WHERE k.name IS NOT NULL
              GROUP BY p.part, k.kind, k.name, s.queue, i.resource
              ORDER BY p.part COLLATE "C", k.kind COLLATE "C", k.name COLLATE "C",
                       s.queue COLLATE "C", i.resource COLLATE "C") AS w
        CROSS JOIN LATERAL (
            SELECT u.ctid, u.in_use FROM quota_identity_usages u
            WHERE u."partition" = w.part AND u.kind = w.kind AND u.name = w.name
              AND u.queue = w.queue AND u.resource = w.resource
            LIMIT 1 FOR UPDATE) AS c;
        -- an application's in-use usage is a bigint too
        SELECT v_broken + count(*) INTO v_broken
        FROM (SELECT a."usage"::jsonb -> i.resource ->> 0 AS in_use, sum(i.amount) AS amount
              FROM unnest(v_ns, v_parts, v_keys) AS p(n, part, app_key)
              CROSS JOIN LATERAL (
                  SELECT a.id, a."usage" FROM quota_applications a
                  WHERE a."partition" = p.part AND a.app_key = p.app_key
                  LIMIT 1) AS a
              JOIN unnest(i_ns, i_resources, i_amounts) AS i(n, resource, amount) ON i.n = p.n
              GROUP BY a.id, a."usage", i.resource) AS s
        WHERE coalesce(s.in_use::numeric, 0) + s.amount > 9223372036854775807;
    END IF;
    IF v_broken > 0 THEN
        RETURN;
    END IF;
    -- their states, items and journal rows, and every counter (a row we hold locked cannot
    -- move, so its address stays good until we update it)
    WITH committed AS (
        UPDATE reservations r SET state = 'committed', resolved_at = v_now WHERE r.id = ANY (v_ids)),
    itemized AS (
        UPDATE reservation_items i SET committed = i.amount WHERE i.reservation_id = ANY (v_ids)),
    journaled AS (
        INSERT INTO quota_journal ("partition", queue, resource, delta, kind, reservation_id, operation_id,
                                   created_at)
        SELECT i.part, i.queue, i.resource, i.amount, 'commit', p_ids[i.n], p_operation_ids[i.n], v_now
        FROM unnest(i_ns, i_parts, i_queues, i_resources, i_amounts) WITH ORDINALITY
             AS i(n, part, queue, resource, amount, o)
        ORDER BY i.o)
    UPDATE quota_usages u SET in_use = u.in_use + d.amount, reserved = u.reserved - d.amount,
                              updated_at = v_now
    FROM unnest(v_tids, v_deltas) AS d(tid, amount) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_tids);
    IF v_app_keys IS NOT NULL THEN
        -- each application once: its in-use area integrated from changed_at up to now
        -- (microseconds), then all of its reservations' usage moved from reserved to in use
        WITH mine AS (
            SELECT a.id AS app, p.n
            FROM unnest(v_ns, v_parts, v_keys) AS p(n, part, app_key)
            CROSS JOIN LATERAL (
                SELECT a.id FROM quota_applications a
                WHERE a."partition" = p.part AND a.app_key = p.app_key
                LIMIT 1) AS a),
        -- (each row looked up by its id, LIMIT 1 keeping it a lookup, and updated at its
        -- address: never a join with the whole table, which a generic plan made while the
        -- table was small would pick)
        apps AS (
            SELECT a.tid, a.id, a."usage"::jsonb AS "usage", a.area::jsonb AS area, a.changed_at,
                   floor(EXTRACT(EPOCH FROM (v_now - a.changed_at)) * 1000000) AS micros, k.n
            FROM (SELECT m.app, count(*) AS n FROM mine m GROUP BY m.app) AS k
            CROSS JOIN LATERAL (
                SELECT a.ctid AS tid, a.id, a."usage", a.area, a.changed_at FROM quota_applications a
                WHERE a.id = k.app LIMIT 1) AS a),
        slots AS (
            SELECT x.id, s.resource,
                   coalesce((x."usage" -> s.resource ->> 0)::bigint, 0) + s.amount AS in_use,
                   greatest(0, coalesce((x."usage" -> s.resource ->> 1)::bigint, 0) - s.amount) AS reserved
            FROM apps x
            JOIN (SELECT m.app, i.resource, sum(i.amount)::bigint AS amount
                  FROM mine m JOIN unnest(i_ns, i_resources, i_amounts) AS i(n, resource, amount) ON i.n = m.n
                  GROUP BY m.app, i.resource) AS s ON s.app = x.id),
        changed AS (
            SELECT x.tid, x.id, x.n,
                   CASE WHEN v_now > x.changed_at THEN v_now ELSE x.changed_at END AS changed_at,
                   CASE WHEN v_now > x.changed_at
                        THEN x.area || coalesce(
                            (SELECT jsonb_object_agg(e.key,
                                        (coalesce((x.area ->> e.key)::numeric, 0)
                                         + (e.value ->> 0)::bigint * x.micros)::text)
                             FROM jsonb_each(x."usage") AS e WHERE (e.value ->> 0)::bigint <> 0),
                            '{}'::jsonb)
                        ELSE x.area END AS area,
                   (x."usage" - (SELECT array_agg(s.resource) FROM slots s WHERE s.id = x.id))
                   || coalesce((SELECT jsonb_object_agg(s.resource, jsonb_build_array(s.in_use, s.reserved))
                                FROM slots s WHERE s.id = x.id AND (s.in_use <> 0 OR s.reserved <> 0)),
                               '{}'::jsonb) AS "usage"
            FROM apps x)
        UPDATE quota_applications a
        SET "usage" = c."usage"::text, area = c.area::text, changed_at = c.changed_at,
            started_at = coalesce(a.started_at, v_now), pending = greatest(0, a.pending - c.n)
        FROM changed c WHERE a.ctid = c.tid;
        UPDATE quota_identity_usages u SET in_use = u.in_use + d.amount, reserved = u.reserved - d.amount,
                                           updated_at = v_now
        FROM unnest(v_id_tids, v_id_deltas) AS d(tid, amount) WHERE u.ctid = d.tid;
        GET DIAGNOSTICS v_updated = ROW_COUNT;
        PERFORM quota_ledger_check_updated(v_updated, v_id_tids);
    END IF;
    RETURN QUERY
    SELECT t.part, t.key, t.queue, t.user_name, t.groups, t.application, t.priority_class, t.created_at,
           t.expires_at, v_now, i.resources, i.amounts, t.n
    FROM unnest(v_ns, v_parts, r_keys, v_queues, r_users, r_groups, r_applications, r_priority_classes,
                r_created, r_expires)
         AS t(n, part, key, queue, user_name, groups, application, priority_class, created_at, expires_at)
    JOIN (SELECT x.n, array_agg(x.resource ORDER BY x.o) AS resources, array_agg(x.amount ORDER BY x.o) AS amounts
          FROM unnest(i_ns, i_resources, i_amounts) WITH ORDINALITY AS x(n, resource, amount, o)
          GROUP BY x.n) AS i ON i.n = t.n
    ORDER BY t.n;
END
$$;
