-- The foundation: the event store (postgres-es layout), the funding ledger, client idempotency
-- keys and the transfer read model.

-- Event store: postgres-es's own layout. `sequence` counts per aggregate; the primary key is what
-- makes two writers on one transfer conflict (the loser's INSERT violates it).
CREATE TABLE events
(
    aggregate_type text                         NOT NULL,
    aggregate_id   text                         NOT NULL,
    sequence       bigint CHECK (sequence >= 0) NOT NULL,
    event_type     text                         NOT NULL,
    event_version  text                         NOT NULL,
    payload        json                         NOT NULL,
    metadata       json                         NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id, sequence)
);

-- Funding ledger: one row per (user, asset). The CHECK is the last line against an overdraft.
CREATE TABLE funding_accounts
(
    user_id    bigint         NOT NULL CHECK (user_id > 0),
    asset      text           NOT NULL,
    balance    numeric(38, 18) NOT NULL DEFAULT 0 CHECK (balance >= 0),
    status     text           NOT NULL DEFAULT 'ACTIVE' CHECK (status IN ('ACTIVE', 'FROZEN', 'DISABLED')),
    created_at timestamptz    NOT NULL DEFAULT now(),
    updated_at timestamptz    NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, asset)
);

-- Every movement the funding ledger decided, applied or refused, keyed by (req_id, operation):
-- the unique key is what makes withdraw, deposit and refund idempotent.
CREATE TABLE funding_journal
(
    id         bigserial PRIMARY KEY,
    req_id     text            NOT NULL,
    operation  text            NOT NULL CHECK (operation IN ('WITHDRAW', 'DEPOSIT', 'REFUND')),
    user_id    bigint          NOT NULL,
    asset      text            NOT NULL,
    amount     numeric(38, 18) NOT NULL CHECK (amount > 0),
    outcome    text            NOT NULL CHECK (outcome IN ('APPLIED', 'REFUSED')),
    code       text,
    created_at timestamptz     NOT NULL DEFAULT now(),
    UNIQUE (req_id, operation),
    CHECK ((outcome = 'APPLIED') = (code IS NULL))
);

-- Money entering the system from outside, idempotent by the outside world's id.
CREATE TABLE external_deposits
(
    external_id text            PRIMARY KEY,
    user_id     bigint          NOT NULL,
    asset       text            NOT NULL,
    amount      numeric(38, 18) NOT NULL CHECK (amount > 0),
    created_at  timestamptz     NOT NULL DEFAULT now()
);
CREATE INDEX external_deposits_user_asset ON external_deposits (user_id, asset);

-- Client idempotency keys, scoped per user. `fingerprint` is the canonical request body, so the
-- same key with a different body can be told apart and refused.
CREATE TABLE transfer_cids
(
    user_id     bigint      NOT NULL,
    cid         text        NOT NULL,
    req_id      text        NOT NULL UNIQUE,
    fingerprint text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, cid)
);

-- Read model of transfers, built from events. `last_sequence` makes an update idempotent and
-- refuses to move the row backwards.
CREATE TABLE transfers_view
(
    req_id          text            PRIMARY KEY,
    user_id         bigint          NOT NULL,
    from_account    text            NOT NULL,
    to_account      text            NOT NULL,
    asset           text            NOT NULL,
    amount          numeric(38, 18) NOT NULL,
    cid             text,
    state           text            NOT NULL,
    state_id        smallint        NOT NULL,
    failure_code    text,
    failure_message text,
    created_at      timestamptz     NOT NULL,
    updated_at      timestamptz     NOT NULL,
    last_sequence   bigint          NOT NULL
);
CREATE INDEX transfers_view_user_created ON transfers_view (user_id, created_at DESC);
CREATE INDEX transfers_view_open ON transfers_view (state_id, updated_at) WHERE state_id NOT IN (40, -10, -30);
