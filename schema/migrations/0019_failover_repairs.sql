-- Repairs after a PostgreSQL failover that lost acknowledged commits (asynchronous replication):
-- one row per req_id spot-core applied a movement under while the event log no longer knew it.
-- The operator's repair re-records the transfer from spot-core's record (the same req_id, user,
-- asset, amount and direction) and drives it through the ordinary commands; this row says who
-- did it, why, from which record, and how it ended. One row per req_id: a repeat answers from
-- it and never creates a second transfer.
CREATE TABLE failover_repairs (
    req_id      TEXT PRIMARY KEY,
    action      TEXT NOT NULL CHECK (action IN ('RE_RECORD')),
    user_id     BIGINT NOT NULL,
    from_type   TEXT NOT NULL,
    to_type     TEXT NOT NULL,
    asset       TEXT NOT NULL,
    amount      NUMERIC NOT NULL,
    -- What spot-core had applied under the req_id when the repair was decided (its lookup).
    spot_record JSONB NOT NULL,
    operator    TEXT NOT NULL,
    reason      TEXT NOT NULL,
    requested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The transfer's state after the repair's drive (NULL until it was driven once).
    final_state TEXT,
    finished_at TIMESTAMPTZ
);
