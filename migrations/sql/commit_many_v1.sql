-- quota_ledger_commit_many(ids, operation ids, guard): commits pending reservations whole, and
-- leaves exactly the rows quota_ledger_commit would leave committing them one after another in
-- call order at one instant, with one statement per step for all of them: their states and
-- items, their journal rows, every counter (reserved -> in_use, each counter once with the sum)
-- and, for the tracked ones (a user or an application), each application row once (its in-use
-- area integrated up to now, then its reservations' usage moved from reserved to in use) and the
-- identity counters on the lineage of its user and group. Declined, and left to the caller
-- alone: an id that is not a pending reservation in time, a repeat of an id already in the
-- call, one with nothing reserved, a tracked one whose application row is missing (without
-- p_guard that aborts the call with QL001, as quota_ledger_commit does), and every one when a
-- counter or an application's usage would pass the bigint limit. Returns quota_ledger_commit's
-- row and idx (1-based) for each committed reservation.
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
SET enable_seqscan = off  -- lookups by key only (see quota_ledger_reserve)
AS $$
DECLARE
    v_now timestamp;
    v_ns integer[];
    v_parts text[];
    v_keys text[];
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
    v_now := TIMEZONE('UTC', clock_timestamp());
    -- every row locked first, in id order; the first occurrence of each id that is pending and
    -- in time is committed; a tracked one's application is found by its app_key
    WITH locked AS (
        SELECT r.id, r."partition", r.state, r.expires_at, r.queue, r.user_name, r.application
        FROM reservations r
        WHERE r.id = ANY (p_ids) ORDER BY r.id COLLATE "C" FOR UPDATE),
    firsts AS (
        SELECT t.id, min(t.n)::integer AS n FROM unnest(p_ids) WITH ORDINALITY AS t(id, n) GROUP BY t.id)
    SELECT array_agg(f.n ORDER BY f.n), array_agg(l."partition" ORDER BY f.n),
           array_agg(CASE WHEN l.user_name IS NOT NULL OR l.application IS NOT NULL
                          THEN coalesce(l.application, E'\t' || l.user_name || E'\t' || l.queue) END
                     ORDER BY f.n)
    INTO v_ns, v_parts, v_keys
    FROM locked l JOIN firsts f ON f.id = l.id
    WHERE l.state = 'pending' AND v_now < l.expires_at
      AND EXISTS (SELECT 1 FROM reservation_items i WHERE i.reservation_id = l.id);
    IF v_ns IS NULL THEN
        RETURN;
    END IF;
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
        SELECT array_agg(t.n ORDER BY t.n), array_agg(t.part ORDER BY t.n), array_agg(t.app_key ORDER BY t.n)
        INTO v_ns, v_parts, v_keys
        FROM unnest(v_ns, v_parts, v_keys) AS t(n, part, app_key)
        WHERE t.app_key IS NULL
           OR EXISTS (SELECT 1 FROM unnest(v_app_parts, v_app_keys) AS a(part, app_key)
                      WHERE a.part = t.part AND a.app_key = t.app_key);
        IF v_ns IS NULL THEN
            RETURN;
        END IF;
    END IF;
    -- the counters in the canonical order, each charged once with the sum
    SELECT count(*) FILTER (WHERE c.in_use::numeric + w.amount > 9223372036854775807),
           array_agg(c.ctid), array_agg(w.amount)
    INTO v_broken, v_tids, v_deltas
    FROM (SELECT k.kind, r."partition", k.scope, i.resource, sum(i.amount)::bigint AS amount
          FROM unnest(v_ns) AS p(n)
          JOIN reservations r ON r.id = p_ids[p.n]
          JOIN reservation_items i ON i.reservation_id = r.id
          CROSS JOIN LATERAL (
              SELECT 0 AS kind, r.queue AS scope
              UNION ALL
              SELECT 1, s.scope FROM unnest(quota_ledger_lineage(r.queue)) AS s(scope)) AS k
          GROUP BY k.kind, r."partition", k.scope, i.resource
          ORDER BY k.kind, r."partition" COLLATE "C", k.scope COLLATE "C", i.resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, u.in_use FROM quota_usages u
        WHERE u."partition" = w."partition"
          AND u.scope_type = CASE w.kind WHEN 0 THEN 'queue' ELSE 'subtree' END
          AND u.scope = w.scope AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    IF v_app_keys IS NOT NULL THEN
        -- the users' and the applications' groups' counters on the lineage (as named by the
        -- application row, as quota_ledger_commit does)
        SELECT v_broken + count(*) FILTER (WHERE c.in_use::numeric + w.amount > 9223372036854775807),
               array_agg(c.ctid), array_agg(w.amount)
        INTO v_broken, v_id_tids, v_id_deltas
        FROM (SELECT r."partition", k.kind, k.name, s.queue, i.resource, sum(i.amount)::bigint AS amount
              FROM unnest(v_ns, v_keys) AS p(n, app_key)
              JOIN reservations r ON r.id = p_ids[p.n]
              JOIN quota_applications a ON a."partition" = r."partition" AND a.app_key = p.app_key
              JOIN reservation_items i ON i.reservation_id = r.id
              CROSS JOIN LATERAL (VALUES ('user', a.user_name), ('group', a.group_name)) AS k(kind, name)
              CROSS JOIN unnest(quota_ledger_lineage(r.queue)) AS s(queue)
              WHERE k.name IS NOT NULL
              GROUP BY r."partition", k.kind, k.name, s.queue, i.resource
              ORDER BY r."partition" COLLATE "C", k.kind COLLATE "C", k.name COLLATE "C",
                       s.queue COLLATE "C", i.resource COLLATE "C") AS w
        CROSS JOIN LATERAL (
            SELECT u.ctid, u.in_use FROM quota_identity_usages u
            WHERE u."partition" = w."partition" AND u.kind = w.kind AND u.name = w.name
              AND u.queue = w.queue AND u.resource = w.resource
            LIMIT 1 FOR UPDATE) AS c;
        -- an application's in-use usage is a bigint too
        SELECT v_broken + count(*) INTO v_broken
        FROM (SELECT a."usage"::jsonb -> i.resource ->> 0 AS in_use, sum(i.amount) AS amount
              FROM unnest(v_ns, v_keys) AS p(n, app_key)
              JOIN reservations r ON r.id = p_ids[p.n]
              JOIN quota_applications a ON a."partition" = r."partition" AND a.app_key = p.app_key
              JOIN reservation_items i ON i.reservation_id = r.id
              GROUP BY a.id, i.resource) AS s
        WHERE coalesce(s.in_use::numeric, 0) + s.amount > 9223372036854775807;
    END IF;
    IF v_broken > 0 THEN
        RETURN;
    END IF;
    UPDATE reservations r SET state = 'committed', resolved_at = v_now
    WHERE r.id = ANY (SELECT p_ids[n] FROM unnest(v_ns) AS n);
    UPDATE reservation_items i SET committed = i.amount
    WHERE i.reservation_id = ANY (SELECT p_ids[n] FROM unnest(v_ns) AS n);
    INSERT INTO quota_journal ("partition", queue, resource, delta, kind, reservation_id, operation_id,
                               created_at)
    SELECT r."partition", r.queue, i.resource, i.amount, 'commit', r.id, p_operation_ids[p.n], v_now
    FROM unnest(v_ns) AS p(n)
    JOIN reservations r ON r.id = p_ids[p.n]
    JOIN reservation_items i ON i.reservation_id = r.id
    ORDER BY p.n, i.resource COLLATE "C";
    IF v_app_keys IS NOT NULL THEN
        -- each application once: its in-use area integrated from changed_at up to now
        -- (microseconds), then all of its reservations' usage moved from reserved to in use
        WITH mine AS (
            SELECT a.id AS app, r.id AS reservation
            FROM unnest(v_ns, v_keys) AS p(n, app_key)
            JOIN reservations r ON r.id = p_ids[p.n]
            JOIN quota_applications a ON a."partition" = r."partition" AND a.app_key = p.app_key),
        apps AS (
            SELECT a.id, a."usage"::jsonb AS "usage", a.area::jsonb AS area, a.changed_at,
                   floor(EXTRACT(EPOCH FROM (v_now - a.changed_at)) * 1000000) AS micros,
                   (SELECT count(*) FROM mine m WHERE m.app = a.id) AS n
            FROM quota_applications a WHERE a.id IN (SELECT m.app FROM mine m)),
        slots AS (
            SELECT x.id, s.resource,
                   coalesce((x."usage" -> s.resource ->> 0)::bigint, 0) + s.amount AS in_use,
                   greatest(0, coalesce((x."usage" -> s.resource ->> 1)::bigint, 0) - s.amount) AS reserved
            FROM apps x
            JOIN (SELECT m.app, i.resource, sum(i.amount)::bigint AS amount
                  FROM mine m JOIN reservation_items i ON i.reservation_id = m.reservation
                  GROUP BY m.app, i.resource) AS s ON s.app = x.id),
        changed AS (
            SELECT x.id, x.n,
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
        FROM changed c WHERE a.id = c.id;
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
    RETURN QUERY
    SELECT r."partition"::text, r."key"::text, r.queue::text, r.user_name::text, r."groups",
           r.application::text, r.priority_class::text, r.created_at, r.expires_at, v_now,
           i.resources, i.amounts, p.n
    FROM unnest(v_ns) AS p(n)
    JOIN reservations r ON r.id = p_ids[p.n]
    CROSS JOIN LATERAL (
        SELECT array_agg(x.resource::text ORDER BY x.resource) AS resources,
               array_agg(x.amount ORDER BY x.resource) AS amounts
        FROM reservation_items x WHERE x.reservation_id = r.id) AS i;
END
$$;
