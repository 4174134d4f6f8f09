-- Projections, the consumer feed, and the fund-conservation halt (docs/adr/0002-global-position.md).

-- Every event gets a global position and the id of the transaction that wrote it. Both have
-- defaults, so postgres-es's INSERT (which names only its own seven columns) and any batched
-- repository that omits them keep working. A sequence value is NOT commit-ordered: position N+1
-- may commit before N. Readers therefore only take events whose transaction is older than every
-- transaction still running (`tx_id < pg_snapshot_xmin(pg_current_snapshot())`) and order them by
-- (tx_id, global_position); see projections/src/projector.rs.
ALTER TABLE events ADD COLUMN global_position bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE events ADD COLUMN tx_id xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE UNIQUE INDEX events_global_position ON events (global_position);
CREATE INDEX events_tx_order ON events (tx_id, global_position);

-- Where each projector stands in the log: the last (tx_id, global_position) it applied and the
-- last dense feed position it handed out. Written in the same transaction as the projector's
-- rows, so a crash can neither skip nor repeat an event.
CREATE TABLE projector_cursor
(
    projector       text        PRIMARY KEY,
    tx_id           xid8        NOT NULL,
    global_position bigint      NOT NULL,
    feed_position   bigint      NOT NULL CHECK (feed_position >= 0),
    events_applied  bigint      NOT NULL CHECK (events_applied >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO projector_cursor (projector, tx_id, global_position, feed_position, events_applied)
VALUES ('main', '0', 0, 0, 0);

-- The consumer feed: every event once, at a dense position (1, 2, 3, ...) handed out by the single
-- projector in the safe order, so a consumer reading `position > N` never misses one that commits
-- later. `event_id` is the consumers' de-duplication key (seed 001): deterministic and immutable.
CREATE TABLE feed
(
    position        bigint      PRIMARY KEY CHECK (position > 0),
    event_id        text        NOT NULL UNIQUE,
    global_position bigint      NOT NULL UNIQUE,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    sequence        bigint      NOT NULL,
    event_type      text        NOT NULL,
    event_version   text        NOT NULL,
    payload         jsonb       NOT NULL,
    -- The transfer's owner, so a user's stream can be read without joining.
    user_id         bigint,
    -- When the event happened (the domain time it carries).
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX feed_user_position ON feed (user_id, position);
CREATE INDEX feed_aggregate ON feed (aggregate_type, aggregate_id, sequence);
CREATE INDEX feed_occurred ON feed (occurred_at);

-- What transfers did to each user's accounts, per asset: net movement of FUNDING and SPOT caused by
-- transfers, and the amount in flight (withdrawn from the source, not yet deposited or refunded).
-- External deposits are not events (they live in `external_deposits`), so an account's expected
-- balance is its deposits plus its net here.
CREATE TABLE transfer_balances
(
    user_id     bigint          NOT NULL,
    asset       text            NOT NULL,
    funding_net numeric(38, 18) NOT NULL DEFAULT 0,
    spot_net    numeric(38, 18) NOT NULL DEFAULT 0,
    in_flight   numeric(38, 18) NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, asset)
);

-- (No CHECK on in_flight >= 0 or count >= 0: the projector adds signed deltas with
-- INSERT .. ON CONFLICT, and a CHECK is evaluated on the proposed row before the conflict is seen.
-- The replay's equality report is what proves these sums right.)

-- How many transfers are in each state right now.
CREATE TABLE transfer_state_counts
(
    state_id smallint PRIMARY KEY,
    state    text     NOT NULL,
    count    bigint   NOT NULL
);

-- Until now the coordinator updated `transfers_view` after each commit (best effort). From here on
-- the projector owns it and rebuilds it from the log from position zero, exactly once.
TRUNCATE transfers_view;

-- History queries page by (created_at, req_id) within a user, optionally by asset and state.
CREATE INDEX transfers_view_user_page ON transfers_view (user_id, created_at DESC, req_id DESC);
CREATE INDEX transfers_view_page ON transfers_view (created_at DESC, req_id DESC);

-- MON-003: one row. While `halted`, every `ledger serve` refuses new transfers (SERVICE_HALTED)
-- until an admin clears it.
CREATE TABLE service_halt
(
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    halted     boolean     NOT NULL DEFAULT false,
    reason     text,
    halted_at  timestamptz,
    cleared_at timestamptz,
    cleared_by bigint
);
INSERT INTO service_halt (id) VALUES (true);

-- Every fund-conservation check that ran, with its report, for the audit trail.
CREATE TABLE invariant_checks
(
    id         bigserial   PRIMARY KEY,
    checked_at timestamptz NOT NULL DEFAULT now(),
    ok         boolean     NOT NULL,
    report     jsonb       NOT NULL
);
