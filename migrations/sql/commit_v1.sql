-- quota_ledger_commit(id, operation id): commits a pending reservation whole: its state and
-- items, its journal rows, its application's usage (reserved -> in use, with the in-use area
-- integrated up to now) and every counter (reserved -> in_use). Declines (QL001) what it cannot
-- do (a reservation not pending or expired, a counter at the bigint limit). Returns the
-- committed reservation.
-- Locks the reservation row, its application row, then the counters, each looked up by its whole
-- unique key in byte order: the queue's own, the subtree counters of its lineage, the user and
-- group counters on the lineage. No partition lock.
CREATE OR REPLACE FUNCTION quota_ledger_commit(p_id text, p_operation_id text)
RETURNS TABLE ("partition" text, "key" text, queue text, user_name text, "groups" text,
               application text, priority_class text, created_at timestamp, expires_at timestamp,
               resolved_at timestamp, resources text[], amounts bigint[])
LANGUAGE plpgsql
SET enable_seqscan = off  -- lookups by key only (see quota_ledger_reserve)
AS $$
DECLARE
    r reservations%ROWTYPE;
    v_now timestamp;
    v_resources text[];
    v_amounts bigint[];
    v_scopes text[];
    v_broken integer;
    v_app quota_applications%ROWTYPE;
    v_usage jsonb;
    v_area jsonb;
    v_micros numeric;
    v_slot jsonb;
    v_in_use bigint;
    v_tids tid[];
    v_deltas bigint[];
    v_id_tids tid[];
    v_id_deltas bigint[];
    v_updated integer;
BEGIN
    SELECT * INTO r FROM reservations WHERE id = p_id FOR UPDATE;
    v_now := TIMEZONE('UTC', clock_timestamp());
    IF NOT FOUND OR r.state <> 'pending' OR v_now >= r.expires_at THEN
        RAISE EXCEPTION 'not a pending reservation' USING ERRCODE = 'QL001';
    END IF;
    SELECT array_agg(i.resource ORDER BY i.resource), array_agg(i.amount ORDER BY i.resource)
    INTO v_resources, v_amounts FROM reservation_items i WHERE i.reservation_id = p_id;
    IF v_resources IS NULL THEN
        RAISE EXCEPTION 'nothing reserved' USING ERRCODE = 'QL001';
    END IF;
    v_scopes := quota_ledger_lineage(r.queue);
    UPDATE reservations SET state = 'committed', resolved_at = v_now WHERE id = p_id;
    UPDATE reservation_items SET committed = amount WHERE reservation_id = p_id;
    INSERT INTO quota_journal ("partition", queue, resource, delta, kind, reservation_id, operation_id,
                               created_at)
    SELECT r."partition", r.queue, t.resource, t.amount, 'commit', p_id, p_operation_id, v_now
    FROM unnest(v_resources, v_amounts) AS t(resource, amount);
    -- a tracked reservation: its application's usage moves from reserved to in use, and the
    -- in-use usage so far is integrated up to now (microseconds, as the Python path does)
    IF r.user_name IS NOT NULL OR r.application IS NOT NULL THEN
        SELECT * INTO v_app FROM quota_applications a
        WHERE a."partition" = r."partition"
          AND a.app_key = coalesce(r.application, E'\t' || r.user_name || E'\t' || r.queue)
        FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no application row' USING ERRCODE = 'QL001';
        END IF;
        v_usage := v_app."usage"::jsonb;
        v_area := v_app.area::jsonb;
        IF v_now > v_app.changed_at THEN
            v_micros := floor(EXTRACT(EPOCH FROM (v_now - v_app.changed_at)) * 1000000);
            FOR v_slot IN SELECT jsonb_build_array(e.key, e.value) FROM jsonb_each(v_usage) AS e LOOP
                v_in_use := (v_slot -> 1 ->> 0)::bigint;
                IF v_in_use <> 0 THEN
                    v_area := v_area || jsonb_build_object(v_slot ->> 0,
                        (coalesce((v_area ->> (v_slot ->> 0))::numeric, 0) + v_in_use * v_micros)::text);
                END IF;
            END LOOP;
            v_app.changed_at := v_now;
        END IF;
        FOR i IN 1 .. cardinality(v_resources) LOOP
            v_slot := coalesce(v_usage -> v_resources[i], '[0, 0]'::jsonb);
            v_slot := jsonb_build_array((v_slot ->> 0)::bigint + v_amounts[i],
                                        greatest(0, (v_slot ->> 1)::bigint - v_amounts[i]));
            IF (v_slot ->> 0)::bigint = 0 AND (v_slot ->> 1)::bigint = 0 THEN
                v_usage := v_usage - v_resources[i];
            ELSE
                v_usage := v_usage || jsonb_build_object(v_resources[i], v_slot);
            END IF;
        END LOOP;
        UPDATE quota_applications
        SET "usage" = v_usage::text, area = v_area::text, changed_at = v_app.changed_at,
            started_at = coalesce(v_app.started_at, v_now), pending = greatest(0, v_app.pending - 1)
        WHERE id = v_app.id;
    END IF;
    -- the counters in the canonical order, looked up by their whole unique key (see reserve)
    SELECT count(*) FILTER (WHERE c.in_use::numeric + c.amount > 9223372036854775807),
           array_agg(c.ctid), array_agg(c.amount)
    INTO v_broken, v_tids, v_deltas
    FROM (SELECT t.resource, t.amount FROM unnest(v_resources, v_amounts) AS t(resource, amount)
          ORDER BY t.resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, u.in_use, w.amount FROM quota_usages u
        WHERE u."partition" = r."partition" AND u.scope_type = 'queue' AND u.scope = r.queue
          AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    SELECT v_broken + count(*) FILTER (WHERE c.in_use::numeric + c.amount > 9223372036854775807),
           v_tids || array_agg(c.ctid), v_deltas || array_agg(c.amount)
    INTO v_broken, v_tids, v_deltas
    FROM (SELECT s.scope, t.resource, t.amount
          FROM unnest(v_scopes) AS s(scope) CROSS JOIN unnest(v_resources, v_amounts) AS t(resource, amount)
          ORDER BY s.scope COLLATE "C", t.resource COLLATE "C") AS w
    CROSS JOIN LATERAL (
        SELECT u.ctid, u.in_use, w.amount FROM quota_usages u
        WHERE u."partition" = r."partition" AND u.scope_type = 'subtree' AND u.scope = w.scope
          AND u.resource = w.resource
        LIMIT 1 FOR UPDATE) AS c;
    IF v_app.id IS NOT NULL THEN
        -- the user's and the application's group's counters on the lineage
        SELECT v_broken + count(*) FILTER (WHERE c.in_use::numeric + c.amount > 9223372036854775807),
               array_agg(c.ctid), array_agg(c.amount)
        INTO v_broken, v_id_tids, v_id_deltas
        FROM (SELECT k.kind, k.name, s.queue, t.resource, t.amount
              FROM (VALUES ('user', v_app.user_name), ('group', v_app.group_name)) AS k(kind, name)
              CROSS JOIN unnest(v_scopes) AS s(queue)
              CROSS JOIN unnest(v_resources, v_amounts) AS t(resource, amount)
              WHERE k.name IS NOT NULL
              ORDER BY k.kind COLLATE "C", k.name COLLATE "C", s.queue COLLATE "C",
                       t.resource COLLATE "C") AS w
        CROSS JOIN LATERAL (
            SELECT u.ctid, u.in_use, w.amount FROM quota_identity_usages u
            WHERE u."partition" = r."partition" AND u.kind = w.kind AND u.name = w.name
              AND u.queue = w.queue AND u.resource = w.resource
            LIMIT 1 FOR UPDATE) AS c;
    END IF;
    IF v_broken > 0 THEN
        RAISE EXCEPTION 'a counter is at the bigint limit' USING ERRCODE = 'QL001';
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
    RETURN QUERY SELECT r."partition"::text, r."key"::text, r.queue::text, r.user_name::text, r."groups",
                        r.application::text, r.priority_class::text, r.created_at, r.expires_at, v_now,
                        v_resources, v_amounts;
END
$$;
