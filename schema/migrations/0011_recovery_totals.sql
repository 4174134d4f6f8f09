-- `/metrics` summed `transfer_retries` at every scrape: a row stays there for every transfer the
-- recovery worker ever touched, so the scrape read a table that grows with history (issue 15).
-- The totals are now kept in one row, by a trigger in the same transaction as each change to
-- `transfer_retries`, so a scrape reads one row whatever the history. Only the worker and manual
-- resolution write `transfer_retries`, never the happy path, so the one hot row costs nothing there.
CREATE TABLE recovery_totals
(
    id              boolean PRIMARY KEY DEFAULT true CHECK (id),
    attempts        bigint  NOT NULL DEFAULT 0,
    refund_failures bigint  NOT NULL DEFAULT 0,
    stuck_alerts    bigint  NOT NULL DEFAULT 0,
    refund_alerts   bigint  NOT NULL DEFAULT 0
);

-- Statement-level triggers with transition tables (as `open_transfers` since 0007): one UPDATE of
-- the totals row per statement, however many rows it touched (MON-001 may mark thousands at once;
-- a row-level trigger would update the one row once per row in the same transaction).
-- `attempts` and `refund_failures` only ever grow per row; the totals count every increase.
CREATE FUNCTION count_recovery_totals_insert() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    UPDATE recovery_totals t SET
        attempts = t.attempts + d.attempts,
        refund_failures = t.refund_failures + d.refund_failures,
        stuck_alerts = t.stuck_alerts + d.stuck_alerts,
        refund_alerts = t.refund_alerts + d.refund_alerts
    FROM (SELECT COALESCE(SUM(attempts), 0) AS attempts,
                 COALESCE(SUM(refund_failures), 0) AS refund_failures,
                 COUNT(*) FILTER (WHERE stuck_alerted_at IS NOT NULL) AS stuck_alerts,
                 COUNT(*) FILTER (WHERE refund_alerted_at IS NOT NULL) AS refund_alerts
          FROM new_rows) d
    WHERE d.attempts > 0 OR d.refund_failures > 0 OR d.stuck_alerts > 0 OR d.refund_alerts > 0;
    RETURN NULL;
END
$$;

CREATE FUNCTION count_recovery_totals_update() RETURNS trigger
    LANGUAGE plpgsql AS
$$
BEGIN
    UPDATE recovery_totals t SET
        attempts = t.attempts + d.attempts,
        refund_failures = t.refund_failures + d.refund_failures,
        stuck_alerts = t.stuck_alerts + d.stuck_alerts,
        refund_alerts = t.refund_alerts + d.refund_alerts
    FROM (SELECT COALESCE(SUM(GREATEST(n.attempts - o.attempts, 0)), 0) AS attempts,
                 COALESCE(SUM(GREATEST(n.refund_failures - o.refund_failures, 0)), 0)
                     AS refund_failures,
                 COUNT(*) FILTER (WHERE n.stuck_alerted_at IS NOT NULL
                                    AND o.stuck_alerted_at IS NULL) AS stuck_alerts,
                 COUNT(*) FILTER (WHERE n.refund_alerted_at IS NOT NULL
                                    AND o.refund_alerted_at IS NULL) AS refund_alerts
          FROM new_rows n JOIN old_rows o USING (req_id)) d
    WHERE d.attempts > 0 OR d.refund_failures > 0 OR d.stuck_alerts > 0 OR d.refund_alerts > 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER transfer_retries_count_inserts
    AFTER INSERT ON transfer_retries
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_recovery_totals_insert();

CREATE TRIGGER transfer_retries_count_updates
    AFTER UPDATE ON transfer_retries
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_recovery_totals_update();

-- What the history holds when this migration runs.
INSERT INTO recovery_totals (attempts, refund_failures, stuck_alerts, refund_alerts)
SELECT COALESCE(SUM(attempts), 0), COALESCE(SUM(refund_failures), 0),
       COUNT(*) FILTER (WHERE stuck_alerted_at IS NOT NULL),
       COUNT(*) FILTER (WHERE refund_alerted_at IS NOT NULL)
FROM transfer_retries;

-- Leases held now: a range scan over the few future `lease_until` values, not the whole table.
CREATE INDEX transfer_retries_lease ON transfer_retries (lease_until);
