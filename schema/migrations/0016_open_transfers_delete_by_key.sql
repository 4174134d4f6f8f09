-- The statement trigger that keeps `open_transfers` (0007, 0012) deleted the rows of finished
-- transfers with `DELETE ... USING last WHERE o.req_id = last.aggregate_id`. Its plan is made
-- once per connection, and after the maintenance task's VACUUM ANALYZE (application::maintenance)
-- the statistics say the table holds a few dozen rows, so the planner joined the other way round:
-- a full scan of `open_transfers_pkey` as the outer side, each entry compared with the batch's
-- transfers. The index also holds every row version a VACUUM could not remove yet: every
-- transfer of the last minute, and, while any snapshot older than them stays open (a pg_dump, a
-- long report, a stuck client), every transfer since that snapshot. With one REPEATABLE READ
-- transaction open for 40 s, `auto_explain` showed that scan reading 2,846 buffers on one append
-- (docs/adr/0003-performance.md, sixth pass). The finished transfers' keys are now handed to the
-- index as an array, which can only be planned as a lookup by key.
CREATE OR REPLACE FUNCTION track_open_transfers() RETURNS trigger
    LANGUAGE plpgsql
    -- As in 0012 (a replaced function keeps none of its old settings): a scan of the whole table
    -- would read the same dead versions.
    SET enable_seqscan = off
AS
$$
BEGIN
    WITH last AS (
        SELECT DISTINCT ON (aggregate_id) aggregate_id, sequence, recorded_at,
                                          transfer_state_after(event_type, payload) AS state
        FROM new_events
        WHERE aggregate_type = 'Transfer'
        ORDER BY aggregate_id, sequence DESC
    ), finished AS (
        DELETE FROM open_transfers o
        WHERE o.req_id = ANY (ARRAY(SELECT aggregate_id FROM last
                                    WHERE state IN ('COMMITTED', 'FAILED', 'ROLLED_BACK')))
    )
    INSERT INTO open_transfers (req_id, state, last_sequence, recorded_at)
    SELECT aggregate_id, state, sequence, recorded_at
    FROM last
    WHERE state NOT IN ('COMMITTED', 'FAILED', 'ROLLED_BACK')
    ON CONFLICT (req_id) DO UPDATE
        SET state = EXCLUDED.state, last_sequence = EXCLUDED.last_sequence,
            recorded_at = EXCLUDED.recorded_at
        WHERE open_transfers.last_sequence < EXCLUDED.last_sequence;
    RETURN NULL;
END
$$;
