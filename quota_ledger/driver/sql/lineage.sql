-- quota_ledger_lineage(queue): the queues on a queue's path from the root, root first
-- ('root.a.b' -> {root, root.a, root.a.b}): the scopes of the subtree counters a request charges.
-- Locks nothing (a pure function of its argument).
CREATE OR REPLACE FUNCTION quota_ledger_lineage(p_queue text) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    -- 'root.a.b' -> {root, root.a, root.a.b}
    SELECT array_agg(array_to_string(parts[1:k], '.') ORDER BY k)
    FROM (SELECT string_to_array(p_queue, '.') AS parts) s,
         generate_series(1, cardinality(parts)) AS k
$$;
