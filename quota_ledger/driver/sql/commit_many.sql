-- quota_ledger_commit_many(ids, operation ids): commits pending reservations whole, as
-- quota_ledger_commit would one after another, with one statement per step for every plain one
-- (no user or application): their states and items, their journal rows and every counter
-- (reserved -> in_use, each counter once with the sum). A tracked reservation is committed by
-- quota_ledger_commit, whose decline (QL001) aborts the call, or with p_guard by
-- quota_ledger_try_commit, a subtransaction, whose decline undoes only that commit. Declined, and
-- left to the caller alone: an id that is not a pending reservation in time, a repeat of an id
-- already in the call, a tracked one that quota_ledger_try_commit declines, and every plain one
-- when a counter would pass the bigint limit, or one with nothing reserved. Raises QL001 only
-- for a tracked commit without p_guard. Returns quota_ledger_commit's row and idx (1-based) for each
-- committed reservation.
-- Locks the reservation rows in byte order of their ids; then each tracked one's application row
-- and counters (quota_ledger_commit); then the plain ones' counters, each looked up by its
-- whole unique key in byte order: the queues' own counters, then the subtree counters of their
-- lineages (by partition, scope, resource). No partition lock.
CREATE OR REPLACE FUNCTION quota_ledger_commit_many(p_ids text[], p_operation_ids text[], p_guard boolean)
RETURNS TABLE ("partition" text, "key" text, queue text, user_name text, "groups" text,
               application text, priority_class text, created_at timestamp, expires_at timestamp,
               resolved_at timestamp, resources text[], amounts bigint[], idx integer)
LANGUAGE plpgsql
SET enable_seqscan = off  -- lookups by key only (see quota_ledger_reserve)
AS $$
DECLARE
    v_now timestamp;
    v_tracked integer[];
    v_plain integer[];
    v_n integer;
    v_broken integer;
    v_tids tid[];
    v_deltas bigint[];
    v_updated integer;
BEGIN
    v_now := TIMEZONE('UTC', clock_timestamp());
    -- every row locked first, in id order; the first occurrence of each id that is pending and
    -- in time is committed
    WITH locked AS (
        SELECT r.id, r.state, r.expires_at, r.user_name, r.application FROM reservations r
        WHERE r.id = ANY (p_ids) ORDER BY r.id COLLATE "C" FOR UPDATE),
    firsts AS (
        SELECT t.id, min(t.n)::integer AS n FROM unnest(p_ids) WITH ORDINALITY AS t(id, n) GROUP BY t.id)
    SELECT array_agg(f.n) FILTER (WHERE l.user_name IS NOT NULL OR l.application IS NOT NULL),
           array_agg(f.n) FILTER (WHERE l.user_name IS NULL AND l.application IS NULL)
    INTO v_tracked, v_plain
    FROM locked l JOIN firsts f ON f.id = l.id
    WHERE l.state = 'pending' AND v_now < l.expires_at
      AND EXISTS (SELECT 1 FROM reservation_items i WHERE i.reservation_id = l.id);
    -- the tracked ones one by one
    IF v_tracked IS NOT NULL THEN
        FOREACH v_n IN ARRAY v_tracked LOOP
            IF p_guard THEN
                RETURN QUERY SELECT c.*, v_n FROM quota_ledger_try_commit(p_ids[v_n], p_operation_ids[v_n]) AS c;
            ELSE
                RETURN QUERY SELECT c.*, v_n FROM quota_ledger_commit(p_ids[v_n], p_operation_ids[v_n]) AS c;
            END IF;
        END LOOP;
    END IF;
    IF v_plain IS NULL THEN
        RETURN;
    END IF;
    -- the plain ones' counters in the canonical order, each charged once with the sum
    SELECT count(*) FILTER (WHERE c.in_use::numeric + w.amount > 9223372036854775807),
           array_agg(c.ctid), array_agg(w.amount)
    INTO v_broken, v_tids, v_deltas
    FROM (SELECT k.kind, r."partition", k.scope, i.resource, sum(i.amount)::bigint AS amount
          FROM unnest(v_plain) AS p(n)
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
    IF v_broken > 0 THEN
        RETURN;
    END IF;
    UPDATE reservations r SET state = 'committed', resolved_at = v_now
    WHERE r.id = ANY (SELECT p_ids[n] FROM unnest(v_plain) AS n);
    UPDATE reservation_items i SET committed = i.amount
    WHERE i.reservation_id = ANY (SELECT p_ids[n] FROM unnest(v_plain) AS n);
    INSERT INTO quota_journal ("partition", queue, resource, delta, kind, reservation_id, operation_id,
                               created_at)
    SELECT r."partition", r.queue, i.resource, i.amount, 'commit', r.id, p_operation_ids[p.n], v_now
    FROM unnest(v_plain) AS p(n)
    JOIN reservations r ON r.id = p_ids[p.n]
    JOIN reservation_items i ON i.reservation_id = r.id
    ORDER BY p.n, i.resource COLLATE "C";
    UPDATE quota_usages u SET in_use = u.in_use + d.amount, reserved = u.reserved - d.amount,
                              updated_at = v_now
    FROM unnest(v_tids, v_deltas) AS d(tid, amount) WHERE u.ctid = d.tid;
    GET DIAGNOSTICS v_updated = ROW_COUNT;
    PERFORM quota_ledger_check_updated(v_updated, v_tids);
    RETURN QUERY
    SELECT r."partition"::text, r."key"::text, r.queue::text, r.user_name::text, r."groups",
           r.application::text, r.priority_class::text, r.created_at, r.expires_at, v_now,
           i.resources, i.amounts, p.n
    FROM unnest(v_plain) AS p(n)
    JOIN reservations r ON r.id = p_ids[p.n]
    CROSS JOIN LATERAL (
        SELECT array_agg(x.resource::text ORDER BY x.resource) AS resources,
               array_agg(x.amount ORDER BY x.resource) AS amounts
        FROM reservation_items x WHERE x.reservation_id = r.id) AS i;
END
$$;
