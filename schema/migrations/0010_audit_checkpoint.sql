-- The incremental fund-conservation check (docs/adr/0006-incremental-audit.md).
--
-- 1. The funding journal and the external deposits get the event log's commit-order scheme
--    (docs/adr/0002-global-position.md): `tx_id` is the writing transaction's id. A row with a
--    lower `id` may commit after a higher one, but a transaction that has not ended is never
--    below `pg_snapshot_xmin` of a snapshot taken later, so "every row with tx_id < horizon" is a
--    set that can never grow once read: the audit consumes exactly those rows and reads the rest
--    (tx_id >= horizon) again at its next run. Existing rows get 0 (consumed at the first run;
--    no table rewrite), new ones the writer's id.
ALTER TABLE funding_journal ADD COLUMN tx_id xid8 NOT NULL DEFAULT '0';
ALTER TABLE funding_journal ALTER COLUMN tx_id SET DEFAULT pg_current_xact_id();
CREATE INDEX funding_journal_tx ON funding_journal (tx_id);

ALTER TABLE external_deposits ADD COLUMN tx_id xid8 NOT NULL DEFAULT '0';
ALTER TABLE external_deposits ALTER COLUMN tx_id SET DEFAULT pg_current_xact_id();
CREATE INDEX external_deposits_tx ON external_deposits (tx_id);

-- 2. The checkpoint: one row of positions (everything below them consumed), per-asset sums of
--    what was consumed, and the reconciliation state of every req_id not yet settled (its
--    consumed applied movements). `version` makes two concurrent runs safe: only the one that
--    read the version it replaces stores its result.
CREATE TABLE audit_checkpoint
(
    id              smallint    PRIMARY KEY CHECK (id = 1),
    version         bigint      NOT NULL,
    events_horizon  xid8        NOT NULL,
    funding_horizon xid8        NOT NULL,
    spot_seq        bigint      NOT NULL CHECK (spot_seq >= 0),
    transfers       bigint      NOT NULL CHECK (transfers >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE audit_checkpoint_assets
(
    asset     text    PRIMARY KEY,
    deposits  numeric NOT NULL,
    in_flight numeric NOT NULL
);

CREATE TABLE audit_checkpoint_open
(
    req_id  text  PRIMARY KEY,
    applied jsonb NOT NULL
);

-- 3. The periodic check's health, cluster-wide, for /metrics: whether the last periodic run
--    decided, how many could not run, how long the last one took, when one last decided.
CREATE TABLE audit_status
(
    id                    smallint         PRIMARY KEY CHECK (id = 1),
    up                    boolean          NOT NULL,
    failures              bigint           NOT NULL DEFAULT 0,
    last_duration_seconds double precision NOT NULL DEFAULT 0,
    last_success_at       timestamptz,
    last_error            text,
    updated_at            timestamptz      NOT NULL DEFAULT now()
);
INSERT INTO audit_status (id, up) VALUES (1, true);
