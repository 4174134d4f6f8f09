-- Alerts an operator reads back (the console, `GET /api/v1/admin/alerts`): MON-004 (a user's
-- transfer requests above the configured frequency) is the first kind recorded here; MON-001..003
-- keep their own records. One row per episode (not per request). The table is bounded: every
-- insert deletes what lies beyond the newest `application::alerts::ALERTS_KEPT` rows, by the
-- primary key, so it holds a fixed window whatever the years of traffic.
CREATE TABLE alerts
(
    id       bigserial PRIMARY KEY,
    code     text        NOT NULL,
    severity text        NOT NULL CHECK (severity IN ('WARNING', 'CRITICAL')),
    user_id  bigint,
    at       timestamptz NOT NULL DEFAULT now(),
    detail   text        NOT NULL
);

-- How many alerts of each code were ever raised (what `/metrics` counts): one row per code, so a
-- scrape reads a row, not the pruned table.
CREATE TABLE alert_totals
(
    code  text PRIMARY KEY,
    total bigint NOT NULL DEFAULT 0
);
