-- quota_ledger_enter(lock namespace, lock key, version): the first step of reserve and expiry.
-- Locks the partition's advisory lock, shared, to the end of the transaction (configuration
-- writers take it exclusive), then checks under it that the configuration in force is the
-- version the caller compiled, declining (QL001) when it is not. Returns the clock (UTC).
CREATE OR REPLACE FUNCTION quota_ledger_enter(p_lock_ns integer, p_lock_key integer, p_version integer)
RETURNS timestamp
LANGUAGE plpgsql AS $$
BEGIN
    -- the partition lock (shared: config writers take it exclusive), then the configuration
    -- version read under it, which must be the one the caller compiled; returns the clock
    PERFORM pg_advisory_xact_lock_shared(p_lock_ns, p_lock_key);
    IF (SELECT version FROM quota_config_head WHERE id = 1) IS DISTINCT FROM p_version THEN
        RAISE EXCEPTION 'configuration changed' USING ERRCODE = 'QL001';
    END IF;
    RETURN TIMEZONE('UTC', clock_timestamp());
END
$$;
