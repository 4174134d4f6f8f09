-- The feed's dense positions are handed out when events are appended, not by the projector, and
-- `feed_index` (a row and three index entries per event, written again by the projector) is gone
-- (docs/adr/0002-global-position.md, docs/adr/0003-performance.md).
--
-- Why the feed stays gap-free and in commit order with any number of writers: every append takes
-- its positions from the one row of `feed_head` with an UPDATE, so the row stays locked until the
-- appending transaction ends. The next appender waits for that lock, so it can only take positions
-- after the previous one has committed (a commit is visible before its locks are released) or
-- rolled back (its UPDATE is undone with it, so no position is lost). Any snapshot that sees an
-- event therefore sees every event at a lower position: a reader asking for `position > P` can
-- never miss one that commits later.
--
-- The owner and the domain time travel with the event (the appender takes them from the
-- aggregate and the payload); the feed's `recorded_at` is now the event's own (migration 0005):
-- when it was appended, no longer when it was projected.

-- No append runs while the existing log gets its positions.
LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE feed_head
(
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    position bigint  NOT NULL CHECK (position >= 0)
);

ALTER TABLE events
    ADD COLUMN feed_position bigint,
    ADD COLUMN user_id       bigint,
    ADD COLUMN occurred_at   timestamptz;

-- What the projector already handed out keeps its position.
UPDATE events e
SET feed_position = f.position,
    user_id       = f.user_id,
    occurred_at   = f.occurred_at
FROM feed_index f
WHERE f.global_position = e.global_position;

-- Events not projected yet (their transactions committed just before this migration) follow, in
-- the projector's order. Their owner is the one in their transfer's `TransferCreated`.
WITH base AS (SELECT COALESCE(max(position), 0) AS head FROM feed_index),
     todo AS (SELECT global_position,
                     row_number() OVER (ORDER BY tx_id, global_position) AS n
              FROM events WHERE feed_position IS NULL)
UPDATE events e
SET feed_position = base.head + todo.n,
    user_id       = (SELECT (c.payload -> 'TransferCreated' ->> 'user_id')::bigint
                     FROM events c
                     WHERE c.aggregate_type = e.aggregate_type
                       AND c.aggregate_id = e.aggregate_id
                       AND c.sequence = 1),
    -- The domain time, cut (not rounded) to microseconds as the projector stored it.
    occurred_at   = COALESCE((SELECT regexp_replace(v ->> 'at', '(\.[0-9]{6})[0-9]+', '\1')::timestamptz
                              FROM json_each(e.payload) AS j(k, v) LIMIT 1), now())
FROM base, todo
WHERE todo.global_position = e.global_position;

INSERT INTO feed_head (position) SELECT COALESCE(max(feed_position), 0) FROM events;

-- An INSERT that names only postgres-es's seven columns (postgres-es itself, tests writing an old
-- log) still takes its position under the same lock, one row at a time.
CREATE FUNCTION next_feed_position() RETURNS bigint
    LANGUAGE sql VOLATILE
AS $$
UPDATE feed_head SET position = position + 1 RETURNING position
$$;

ALTER TABLE events
    ALTER COLUMN feed_position SET DEFAULT next_feed_position(),
    ALTER COLUMN feed_position SET NOT NULL,
    ALTER COLUMN occurred_at SET DEFAULT now(),
    ALTER COLUMN occurred_at SET NOT NULL;

CREATE UNIQUE INDEX events_feed_position ON events (feed_position);
CREATE INDEX events_user_feed_position ON events (user_id, feed_position);

-- The view keeps the columns and order readers had.
CREATE OR REPLACE VIEW feed AS
SELECT e.feed_position AS position,
       e.aggregate_type || ':' || e.aggregate_id || ':' || e.sequence AS event_id,
       e.global_position,
       e.aggregate_type,
       e.aggregate_id,
       e.sequence,
       e.event_type,
       e.event_version,
       e.payload,
       e.user_id,
       e.occurred_at,
       e.recorded_at
FROM events e;

DROP TABLE feed_index;

-- The projector hands out no positions any more.
ALTER TABLE projector_cursor DROP COLUMN feed_position;

-- Nothing reads the log by `global_position` alone any more (the feed's join was the last): the
-- projector, the replay and the audit read by (tx_id, global_position) on `events_tx_order`, and
-- an identity column's values are unique without an index. One index entry less per event.
DROP INDEX events_global_position;
