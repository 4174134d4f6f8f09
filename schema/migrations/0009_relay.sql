-- The JetStream relay (relay/, docs/adr/0005-relay.md): one row per stream it publishes to.
-- `position` is the last feed position JetStream acknowledged, written only after that ack and
-- only forward (never below what is stored). The stream's own last message is checked too at
-- every start, so this row is a floor, never the only guard against a repeat.
-- The other columns are for operators and `/metrics`: who leads, the last error, alerts raised.
CREATE TABLE relay_checkpoint (
    stream          text PRIMARY KEY,
    position        bigint NOT NULL DEFAULT 0 CHECK (position >= 0),
    stream_sequence bigint NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    leader          text,
    leader_since    timestamptz,
    last_error      text,
    last_error_at   timestamptz,
    lag_alerts      bigint NOT NULL DEFAULT 0
);
