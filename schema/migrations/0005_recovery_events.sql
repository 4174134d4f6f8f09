-- Recovery straight from the event log: the recovery worker must keep finding open transfers when
-- the projector is frozen (a transaction held open anywhere on the server pins the horizon the
-- projector reads below; an undecodable event stops it). Neither affects this path.

-- When each event was written, by database time (the writing transaction's start, which is never
-- later than its commit). A default, so every writer's INSERT that names only its own columns
-- keeps working; existing rows get the migration's time. The event table is still only appended
-- to: nothing here updates a row of it.
ALTER TABLE events ADD COLUMN recorded_at timestamptz NOT NULL DEFAULT now();

-- The state a transfer is in right after an event (domain::TransferEvent::resulting_state). An
-- event type this does not know gives 'UNKNOWN', which counts as open: the worker then tries it
-- and records why it cannot, rather than losing sight of it.
CREATE FUNCTION transfer_state_after(event_type text, payload json) RETURNS text
    LANGUAGE sql IMMUTABLE AS
$$
SELECT CASE event_type
           WHEN 'TransferCreated' THEN 'INIT'
           WHEN 'SourceWithdrawStarted' THEN 'SOURCE_PENDING'
           WHEN 'SourceWithdrawn' THEN 'SOURCE_DONE'
           WHEN 'TargetDepositStarted' THEN 'TARGET_PENDING'
           WHEN 'CompensationStarted' THEN 'COMPENSATING'
           WHEN 'TransferCommitted' THEN 'COMMITTED'
           WHEN 'TransferFailed' THEN 'FAILED'
           WHEN 'TransferRolledBack' THEN 'ROLLED_BACK'
           WHEN 'TransferManuallyResolved'
               THEN COALESCE(payload -> 'TransferManuallyResolved' ->> 'to_state', 'UNKNOWN')
           ELSE 'UNKNOWN'
           END
$$;

-- One row per transfer whose last event is not terminal: what the recovery worker scans. Kept by
-- a trigger in the same transaction as the event INSERT, so it is exactly as committed as the log
-- and needs no projector, no horizon and no decoding in Rust. Small: terminal transfers leave it.
CREATE TABLE open_transfers
(
    req_id        text        PRIMARY KEY,
    state         text        NOT NULL,
    last_sequence bigint      NOT NULL,
    -- The last event's `recorded_at`: how long the transfer has sat unchanged.
    recorded_at   timestamptz NOT NULL
);
CREATE INDEX open_transfers_recorded ON open_transfers (recorded_at);

CREATE FUNCTION track_open_transfer() RETURNS trigger
    LANGUAGE plpgsql AS
$$
DECLARE
    next_state text;
BEGIN
    IF NEW.aggregate_type <> 'Transfer' THEN
        RETURN NULL;
    END IF;
    next_state := transfer_state_after(NEW.event_type, NEW.payload);
    IF next_state IN ('COMMITTED', 'FAILED', 'ROLLED_BACK') THEN
        DELETE FROM open_transfers WHERE req_id = NEW.aggregate_id;
    ELSE
        INSERT INTO open_transfers (req_id, state, last_sequence, recorded_at)
        VALUES (NEW.aggregate_id, next_state, NEW.sequence, NEW.recorded_at)
        ON CONFLICT (req_id) DO UPDATE
            SET state = EXCLUDED.state, last_sequence = EXCLUDED.last_sequence,
                recorded_at = EXCLUDED.recorded_at
            WHERE open_transfers.last_sequence < EXCLUDED.last_sequence;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_track_open_transfers
    AFTER INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION track_open_transfer();

-- Transfers already open when this migration runs.
INSERT INTO open_transfers (req_id, state, last_sequence, recorded_at)
SELECT aggregate_id, state, sequence, recorded_at
FROM (SELECT DISTINCT ON (aggregate_id) aggregate_id, sequence, recorded_at,
                                        transfer_state_after(event_type, payload) AS state
      FROM events
      WHERE aggregate_type = 'Transfer'
      ORDER BY aggregate_id, sequence DESC) last
WHERE state NOT IN ('COMMITTED', 'FAILED', 'ROLLED_BACK');

-- What kind of error the last attempt ended in (TIMEOUT, NETWORK, STORE, REFUSED_BY_TARGET,
-- MISMATCH, UNKNOWN): what the admin API shows. `last_error` keeps the detail for operators with
-- database access and is never sent to a client.
ALTER TABLE transfer_retries ADD COLUMN last_error_category text;
