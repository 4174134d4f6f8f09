-- What operators look at (the admin API's overview, timeline and conservation pages).

-- 1. Every fund-conservation run that decided (periodic and on demand, incremental and full), in
--    compact form: when, which mode, the result, how long it took, how many violations, and per
--    asset its result and difference. Kept bounded: each insert removes the passing runs older
--    than the newest `application::audit::history::RUNS_KEPT` (a violation halts the service, so
--    failing runs are few and all are kept). `invariant_checks` keeps the full reports.
CREATE TABLE invariant_runs
(
    id          bigserial   PRIMARY KEY,
    checked_at  timestamptz NOT NULL DEFAULT now(),
    mode        text        NOT NULL CHECK (mode IN ('incremental', 'full')),
    ok          boolean     NOT NULL,
    duration_ms bigint      NOT NULL CHECK (duration_ms >= 0),
    violations  integer     NOT NULL CHECK (violations >= 0),
    assets      jsonb       NOT NULL
);

-- 2. The recovery worker's heartbeat: one row, written at the end of every pass by whichever
--    worker made it, so "when did recovery last run" is a fact, not a guess from its attempts
--    (a pass with nothing due writes no attempt).
CREATE TABLE recovery_heartbeat
(
    id           smallint    PRIMARY KEY CHECK (id = 1),
    worker       text        NOT NULL,
    last_pass_at timestamptz NOT NULL,
    passes       bigint      NOT NULL DEFAULT 0 CHECK (passes >= 0)
);

-- 3. Each attempt's error category (TIMEOUT, NETWORK, STORE, REFUSED_BY_TARGET, MISMATCH,
--    UNKNOWN), as `transfer_retries.last_error_category` has it for the last one, so a
--    transfer's timeline shows every attempt's category without its raw error text.
ALTER TABLE recovery_attempts ADD COLUMN error_category text;
