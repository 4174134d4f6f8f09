-- Daily transfer limits (seed 000 section 1.5.6) and the admin-managed asset configuration. Both
-- live here, not in one process's memory, so every `ledger serve` instance and a restart see the
-- same counters and the same asset settings.

-- Transfers created per user and UTC day. A row is incremented only while below the limit (one
-- conditional UPSERT), so concurrent requests on several processes can never overshoot.
CREATE TABLE daily_transfer_counts
(
    user_id bigint NOT NULL CHECK (user_id > 0),
    day     date   NOT NULL,
    count   bigint NOT NULL CHECK (count >= 0),
    PRIMARY KEY (user_id, day)
);

-- Amount transferred per user, asset and UTC day, reserved the same way.
CREATE TABLE daily_transfer_amounts
(
    user_id bigint          NOT NULL CHECK (user_id > 0),
    day     date            NOT NULL,
    asset   text            NOT NULL,
    amount  numeric(38, 18) NOT NULL CHECK (amount >= 0),
    PRIMARY KEY (user_id, day, asset)
);

-- Asset settings changed by an admin. At start-up and periodically they are laid over the
-- configuration file's defaults: a row here wins over the file for its symbol.
CREATE TABLE assets
(
    symbol                    text            PRIMARY KEY,
    precision                 integer         NOT NULL CHECK (precision BETWEEN 0 AND 18),
    min_transfer_amount       numeric(38, 18) NOT NULL CHECK (min_transfer_amount > 0),
    max_transfer_amount       numeric(38, 18) NOT NULL,
    status                    text            NOT NULL CHECK (status IN ('ACTIVE', 'SUSPENDED')),
    internal_transfer_enabled boolean         NOT NULL,
    updated_at                timestamptz     NOT NULL DEFAULT now(),
    CHECK (max_transfer_amount >= min_transfer_amount)
);
