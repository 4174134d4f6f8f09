-- Feed positions are still handed out at append, dense and in commit order (0013), but no longer
-- by updating one row: `feed_head` was a single row that every append updated, and PostgreSQL
-- keeps every version of an updated row while any snapshot older than the update exists. One
-- REPEATABLE READ transaction left open for 40 s (a pg_dump, a long report, an audit, a stuck
-- client) made each append walk the thousands of versions made since it began: 4,401 buffer
-- reads per append statement instead of a handful, 3.2 ms per call instead of 0.6, transfers/s
-- halved, and the cost grows with the snapshot's age (docs/adr/0003-performance.md, sixth pass).
--
-- Now an append takes a transaction-scoped advisory lock (held until its transaction ends, as
-- the row lock was) and reads the highest committed position from the `events_feed_position`
-- index with a fresh snapshot taken after the lock: one step down the index's right edge,
-- whatever the age of any other snapshot. The ordering argument of 0013 is unchanged: a commit
-- is visible before its locks are released, so the next appender, which can only read the head
-- after taking the lock, sees every position handed out before; a rollback gives its positions
-- back because its rows are gone. Appends must run in READ COMMITTED (every ledger write does):
-- under a transaction snapshot the head could be stale, and the unique index refuses the
-- duplicate position.

-- The head, the last position handed out, is read from the log: the one definition that the
-- appenders below and the readers that asked the `feed_head` table (the feed's head, the relay's
-- lag) share.
DROP TABLE feed_head;
CREATE VIEW feed_head AS
SELECT COALESCE(max(feed_position), 0)::bigint AS position
FROM events;

-- The lock every appender of the feed holds until its transaction ends ('LEDGER' 0003; the
-- projector's are 0001 and 0002, and the relay's two-key locks live in another key space).
CREATE FUNCTION feed_take() RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    -- The head is read down the index, whatever statistics a fresh database has.
    SET enable_seqscan = off
AS $$
DECLARE
    head bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(5495873993171927043);
    -- A statement of a VOLATILE function takes a new snapshot: it sees every append that
    -- committed before the lock was granted, including this transaction's own earlier rows.
    SELECT position INTO head FROM feed_head;
    RETURN head;
END
$$;

COMMENT ON FUNCTION feed_take() IS
    'Locks the feed for appending until the transaction ends and returns the highest position '
    'handed out so far; the caller numbers its events from the next one.';

-- A raw INSERT that names only postgres-es's seven columns still takes each row's position under
-- the same lock, one row at a time (the row before is visible to the next call's snapshot).
CREATE OR REPLACE FUNCTION next_feed_position() RETURNS bigint
    LANGUAGE sql VOLATILE
AS $$
SELECT feed_take() + 1
$$;

