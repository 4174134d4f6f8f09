-- A transfer created under a client key (`cid`) commits only while the key's claim still names
-- its req_id. A claim too old for the idempotency horizon is re-keyed by a later request
-- (`application/src/submit.rs`); without this guard, a creation delayed past that point (a
-- commit stalled in the network for longer than half the retention) would still commit, and the
-- one key would hold two transfers. The append statement calls this function on the claims of
-- the creations it carries: it takes a share lock on each claim row, so a re-key (an UPDATE of
-- the row) waits for the append to end and then sees the transfer it created, and an append that
-- comes after a re-key finds the row naming another req_id and is refused whole.
CREATE FUNCTION cid_claims_hold(users bigint[], cids text[], req_ids text[]) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    held bigint;
BEGIN
    IF cardinality(users) = 0 THEN
        RETURN true;
    END IF;
    SELECT count(*) INTO held
    FROM (SELECT 1
          FROM transfer_cids c
          JOIN unnest(users, cids, req_ids) AS g(user_id, cid, req_id)
            ON c.user_id = g.user_id AND c.cid = g.cid AND c.req_id = g.req_id
          FOR SHARE OF c) AS locked;
    IF held < cardinality(users) THEN
        RAISE EXCEPTION 'a client key claim no longer names the transfer being created'
            USING ERRCODE = 'LC001';
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION cid_claims_hold(bigint[], text[], text[]) IS
    'Share-locks each (user_id, cid) claim and raises LC001 unless every one still names the '
    'req_id created under it; called by the event append for creations that carry a cid.';
