-- The same decisions as 0008, evaluated the cheap way. 0008 decided every movement with one CASE
-- over the three operations, and the REFUND branch holds a subquery (the matching withdraw in the
-- journal). An expression with a subquery is not a "simple expression" to PL/pgSQL, so every
-- movement's decision, a withdraw's or a deposit's too, ran as a full query through the executor
-- (start, run, end). `pg_stat_statements` with `track = all` and `track_functions = pl` showed
-- the function costing about 127 us per movement, of which its three statements took 73 us.
-- Now each operation has its own branch: a withdraw's and a deposit's decisions are simple
-- expressions, and only a refund runs the subquery. Same rules, same order, same answers
-- (docs/adr/0003-performance.md).
CREATE OR REPLACE FUNCTION funding_fresh_movements(
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
        IF ops[i] = 'WITHDRAW' THEN
            decided := CASE WHEN NOT acct_found THEN 'SOURCE_ACCOUNT_NOT_FOUND'
                            WHEN acct_status = 'FROZEN' THEN 'ACCOUNT_FROZEN'
                            WHEN acct_status = 'DISABLED' THEN 'ACCOUNT_DISABLED'
                            WHEN acct_balance < amounts[i] THEN 'INSUFFICIENT_BALANCE' END;
        ELSIF ops[i] = 'DEPOSIT' THEN
            decided := CASE WHEN NOT acct_found THEN 'TARGET_ACCOUNT_NOT_FOUND'
                            WHEN acct_status = 'DISABLED' THEN 'ACCOUNT_DISABLED'
                            WHEN acct_balance + amounts[i] >= 100000000000000000000 THEN 'OVERFLOW'
                       END;
        ELSIF ops[i] = 'REFUND' THEN
            -- A refund is bound to an applied withdraw of the same details; it is never refused
            -- for the account's status, or the money would stay in flight.
            decided := CASE WHEN NOT acct_found
                              OR NOT EXISTS (SELECT 1 FROM funding_journal j
                                             WHERE j.req_id = req_ids[i] AND j.operation = 'WITHDRAW'
                                               AND j.outcome = 'APPLIED' AND j.user_id = user_ids[i]
                                               AND j.asset = assets[i] AND j.amount = amounts[i])
                            THEN 'NO_MATCHING_WITHDRAW' END;
        ELSE
            decided := NULL;
        END IF;
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
