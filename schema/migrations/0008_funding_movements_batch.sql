-- Fresh funding movements, decided and applied in one call for any number of them, so that the
-- movements of many concurrent transfers share one statement and one commit (group commit;
-- docs/adr/0003-performance.md). The decision rules are the ones the single-movement statement
-- applied before; that statement is gone and a lone movement is a batch of one.
--
-- Per movement, in the order given (the caller sorts by account, so that two batches lock the
-- same accounts in the same order and cannot deadlock):
--   1. lock the account row (FOR UPDATE sees its newest committed version, and every earlier
--      movement of this batch);
--   2. decide: a refusal code, or none;
--   3. claim (req_id, operation) in the journal with that decision; a key claimed before leaves
--      everything unchanged and returns no row for that movement (the caller answers with the
--      first decision);
--   4. change the balance only when the claim was inserted as APPLIED.
-- Any error aborts the whole call, so nothing of it is applied; the caller then retries each
-- movement alone, and the journal's key makes a retry of anything that did commit harmless.
CREATE FUNCTION funding_fresh_movements(
    ops text[], req_ids text[], user_ids bigint[], assets text[], amounts numeric[])
    RETURNS TABLE (idx integer, outcome text, code text, moved bigint)
    LANGUAGE plpgsql AS
$$
#variable_conflict use_column
DECLARE
    i integer;
    acct_balance numeric;
    acct_status text;
    acct_found boolean;
    decided text;
    claimed text;
    changed bigint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(ops, 1), 0) LOOP
        SELECT a.balance, a.status INTO acct_balance, acct_status
        FROM funding_accounts a
        WHERE a.user_id = user_ids[i] AND a.asset = assets[i]
        FOR UPDATE;
        acct_found := FOUND;
        decided := CASE ops[i]
            WHEN 'WITHDRAW' THEN
                CASE WHEN NOT acct_found THEN 'SOURCE_ACCOUNT_NOT_FOUND'
                     WHEN acct_status = 'FROZEN' THEN 'ACCOUNT_FROZEN'
                     WHEN acct_status = 'DISABLED' THEN 'ACCOUNT_DISABLED'
                     WHEN acct_balance < amounts[i] THEN 'INSUFFICIENT_BALANCE' END
            WHEN 'DEPOSIT' THEN
                CASE WHEN NOT acct_found THEN 'TARGET_ACCOUNT_NOT_FOUND'
                     WHEN acct_status = 'DISABLED' THEN 'ACCOUNT_DISABLED'
                     WHEN acct_balance + amounts[i] >= 100000000000000000000 THEN 'OVERFLOW' END
            -- A refund is bound to an applied withdraw of the same details; it is never refused
            -- for the account's status, or the money would stay in flight.
            WHEN 'REFUND' THEN
                CASE WHEN NOT acct_found
                       OR NOT EXISTS (SELECT 1 FROM funding_journal j
                                      WHERE j.req_id = req_ids[i] AND j.operation = 'WITHDRAW'
                                        AND j.outcome = 'APPLIED' AND j.user_id = user_ids[i]
                                        AND j.asset = assets[i] AND j.amount = amounts[i])
                     THEN 'NO_MATCHING_WITHDRAW' END
        END;
        claimed := NULL;
        INSERT INTO funding_journal AS j (req_id, operation, user_id, asset, amount, outcome, code)
        VALUES (req_ids[i], ops[i], user_ids[i], assets[i], amounts[i],
                CASE WHEN decided IS NULL THEN 'APPLIED' ELSE 'REFUSED' END, decided)
        ON CONFLICT (req_id, operation) DO NOTHING
        RETURNING j.outcome INTO claimed;
        CONTINUE WHEN claimed IS NULL;
        changed := 0;
        IF claimed = 'APPLIED' THEN
            UPDATE funding_accounts a
            SET balance = CASE WHEN ops[i] = 'WITHDRAW' THEN a.balance - amounts[i]
                               ELSE a.balance + amounts[i] END,
                updated_at = now()
            WHERE a.user_id = user_ids[i] AND a.asset = assets[i];
            GET DIAGNOSTICS changed = ROW_COUNT;
        END IF;
        idx := i;
        outcome := claimed;
        code := decided;
        moved := changed;
        RETURN NEXT;
    END LOOP;
END
$$;
