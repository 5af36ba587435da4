-- quota_ledger_check_updated(updated, addresses): after an update of locked rows by their
-- physical addresses, fails the call as a serialization failure (40001, which the driver
-- retries) unless every address was updated. Locks nothing.
CREATE OR REPLACE FUNCTION quota_ledger_check_updated(p_updated integer, p_tids tid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- A counter locked in this transaction keeps its address until we update it; should that
    -- ever not hold, fail the whole call as a serialization failure (the driver retries it)
    -- rather than lose an update.
    IF p_updated <> coalesce(cardinality(p_tids), 0) THEN
        RAISE EXCEPTION 'a locked counter moved' USING ERRCODE = '40001';
    END IF;
END
$$;
