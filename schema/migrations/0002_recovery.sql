-- The recovery worker's bookkeeping: per open transfer its retry schedule, lease and alerts, and
-- an append-only log of every attempt. The event log stays the truth about a transfer's state;
-- these tables only say when to try again, who is trying, and what went wrong last.

-- One row per transfer the worker has touched (or alerted on).
-- A lease (`lease_owner`, `lease_until`) is taken with one conditional upsert, so two `ledger
-- serve` processes never drive the same transfer at once; a crashed owner's lease simply expires.
CREATE TABLE transfer_retries
(
    req_id            text        PRIMARY KEY,
    -- The transfer's state when the worker last looked (for listing; the events are the truth).
    state             text        NOT NULL,
    attempts          integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- Consecutive refund attempts that did not succeed (MON-002 alerts at 3).
    refund_failures   integer     NOT NULL DEFAULT 0 CHECK (refund_failures >= 0),
    last_error        text,
    last_attempt_at   timestamptz,
    next_retry_at     timestamptz NOT NULL DEFAULT now(),
    lease_owner       text,
    lease_until       timestamptz,
    -- When the CRITICAL alerts were raised, so each is raised once per transfer, not per pass.
    stuck_alerted_at  timestamptz,
    refund_alerted_at timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX transfer_retries_due ON transfer_retries (next_retry_at);

-- Every attempt the worker made, with who made it and when it started and ended: the evidence
-- that no two workers ever held one transfer at the same time.
CREATE TABLE recovery_attempts
(
    id           bigserial   PRIMARY KEY,
    req_id       text        NOT NULL,
    worker       text        NOT NULL,
    state_before text        NOT NULL,
    state_after  text,
    outcome      text,
    error        text,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz
);
CREATE INDEX recovery_attempts_req ON recovery_attempts (req_id, id);
