-- quota_ledger_try_commit(id, operation id): quota_ledger_commit for a call inside a larger
-- transaction (a batch of requests decided together): a decline (QL001) undoes only this call's
-- changes and returns no row instead of aborting the transaction; any other error is raised.
-- Locks what quota_ledger_commit locks; a declined call lets go of the row locks it took (the
-- block's subtransaction ends).
CREATE OR REPLACE FUNCTION quota_ledger_try_commit(p_id text, p_operation_id text)
RETURNS TABLE ("partition" text, "key" text, queue text, user_name text, "groups" text,
               application text, priority_class text, created_at timestamp, expires_at timestamp,
               resolved_at timestamp, resources text[], amounts bigint[])
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN QUERY SELECT * FROM quota_ledger_commit(p_id, p_operation_id);
EXCEPTION WHEN SQLSTATE 'QL001' THEN
    RETURN;
END
$$;
