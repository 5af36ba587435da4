-- quota_ledger_try_reserve(...): quota_ledger_reserve for a call inside a larger transaction (a
-- batch of requests decided together): a decline (QL001) undoes only this call's changes and
-- returns NULL instead of aborting the transaction; any other error is raised as it is.
-- Locks what quota_ledger_reserve locks; a declined call lets go of the row locks it took (the
-- block's subtransaction ends), not of the shared partition lock, which the transaction holds.
CREATE OR REPLACE FUNCTION quota_ledger_try_reserve(
    p_id text, p_partition text, p_key text, p_request_hash text, p_queue text,
    p_resources text[], p_amounts bigint[], p_ttl_us bigint, p_priority_class text, p_kube text,
    p_version integer, p_lock_ns integer, p_lock_key integer,
    p_quota_names text[], p_quota_resources text[], p_quota_amounts bigint[],
    p_user text, p_groups text, p_application text, p_app_key text, p_group text,
    p_id_kinds text[], p_id_names text[], p_id_queues text[], p_id_resources text[], p_id_amounts bigint[],
    p_id_limits bigint[]
) RETURNS timestamp
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN quota_ledger_reserve(
        p_id, p_partition, p_key, p_request_hash, p_queue, p_resources, p_amounts, p_ttl_us,
        p_priority_class, p_kube, p_version, p_lock_ns, p_lock_key,
        p_quota_names, p_quota_resources, p_quota_amounts,
        p_user, p_groups, p_application, p_app_key, p_group,
        p_id_kinds, p_id_names, p_id_queues, p_id_resources, p_id_amounts, p_id_limits);
EXCEPTION WHEN SQLSTATE 'QL001' THEN
    RETURN NULL;
END
$$;
