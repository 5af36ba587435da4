-- quota_ledger_over(partition, queue, items, identity counters, ResourceQuota charges): whether
-- one request of the queue, asking for the items, would take a counter it is charged to over its
-- limit: a subtree counter of the queue's lineage, a user or group counter (its resources; not
-- 'applications', which only a request that starts its application is charged), or a
-- ResourceQuota counter of the queue, as they hold now. Only existing counters count (a missing
-- one holds nothing yet).
-- Locks nothing (its caller holds those counters).
CREATE OR REPLACE FUNCTION quota_ledger_over(
    p_partition text, p_queue text, p_item_resources text[], p_item_amounts bigint[],
    p_id_kinds text[], p_id_names text[], p_id_queues text[], p_id_resources text[], p_id_amounts bigint[],
    p_quota_names text[], p_quota_resources text[], p_quota_amounts bigint[]
) RETURNS boolean
LANGUAGE plpgsql STABLE  -- (PL/pgSQL: its plan is kept per connection, where an SQL function's is not)
SET enable_seqscan = off  -- lookups by key only
AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1
        FROM unnest(p_item_resources, p_item_amounts) AS i(resource, amount)
        CROSS JOIN unnest(quota_ledger_lineage(p_queue)) AS s(scope)
        JOIN quota_usages u ON u."partition" = p_partition AND u.scope_type = 'subtree' AND u.scope = s.scope
                           AND u.resource = i.resource
        WHERE u.hard_limit IS NOT NULL AND u.in_use::numeric + u.reserved + i.amount > u.hard_limit
        UNION ALL
        SELECT 1
        FROM unnest(p_id_kinds, p_id_names, p_id_queues, p_id_resources, p_id_amounts)
             AS t(kind, name, queue, resource, amount)
        JOIN quota_identity_usages u ON u."partition" = p_partition AND u.kind = t.kind AND u.name = t.name
                                    AND u.queue = t.queue AND u.resource = t.resource
        WHERE t.resource <> 'applications' AND u.in_use::numeric + u.reserved + t.amount > u.hard_limit
        UNION ALL
        SELECT 1
        FROM unnest(p_quota_names, p_quota_resources, p_quota_amounts) AS q(name, resource, amount)
        JOIN quota_identity_usages u ON u."partition" = p_partition AND u.kind = 'quota' AND u.name = q.name
                                    AND u.queue = p_queue AND u.resource = q.resource
        WHERE u.in_use::numeric + u.reserved + q.amount > u.hard_limit);
END
$$;
