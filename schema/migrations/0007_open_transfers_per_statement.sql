-- `open_transfers` was kept by a row trigger: one PL/pgSQL call and one upsert or delete per
-- event, most of the cost of appending a batch of events (docs/adr/0003-performance.md). A
-- statement trigger does the same with two set-based statements per INSERT, from the rows the
-- statement wrote (its transition table). Within one statement, a transfer's last event decides,
-- exactly as applying the rows one by one in sequence order did: a final state removes the row,
-- any other state inserts it or moves it forward (never back: `last_sequence` only grows).
DROP TRIGGER events_track_open_transfers ON events;
DROP FUNCTION track_open_transfer();

CREATE FUNCTION track_open_transfers() RETURNS trigger
    LANGUAGE plpgsql AS
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
        USING last
        WHERE o.req_id = last.aggregate_id
          AND last.state IN ('COMMITTED', 'FAILED', 'ROLLED_BACK')
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

CREATE TRIGGER events_track_open_transfers
    AFTER INSERT ON events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION track_open_transfers();
