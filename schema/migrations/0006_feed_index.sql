-- The feed stops copying every event. What the projector decides is kept in `feed_index`: the
-- dense position, which event holds it (its global position), the owner and the domain time. The
-- rest is the event itself, read from the immutable log through the view `feed`, which keeps the
-- columns and order readers had. Rebuilding the feed (replay) then writes narrow rows instead of a
-- second copy of every payload (docs/adr/0003-performance.md).
--
-- Uniqueness is what it was: `position` and `global_position` here, and the event id
-- (`<aggregate type>:<aggregate id>:<sequence>`) through the event table's primary key.
CREATE TABLE feed_index
(
    position        bigint      PRIMARY KEY CHECK (position > 0),
    global_position bigint      NOT NULL UNIQUE,
    -- The transfer's owner, so a user's stream is read by an index.
    user_id         bigint,
    -- When the event happened (the domain time it carries).
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now()
);

INSERT INTO feed_index (position, global_position, user_id, occurred_at, recorded_at)
SELECT position, global_position, user_id, occurred_at, recorded_at FROM feed;

DROP TABLE feed;

CREATE INDEX feed_index_user_position ON feed_index (user_id, position);

CREATE VIEW feed AS
SELECT f.position,
       e.aggregate_type || ':' || e.aggregate_id || ':' || e.sequence AS event_id,
       f.global_position,
       e.aggregate_type,
       e.aggregate_id,
       e.sequence,
       e.event_type,
       e.event_version,
       e.payload,
       f.user_id,
       f.occurred_at,
       f.recorded_at
FROM feed_index f
JOIN events e ON e.global_position = f.global_position;

-- (user_id, created_at DESC) is a prefix of transfers_view_user_page (user_id, created_at DESC,
-- req_id DESC), which serves every query it served; keeping both cost every projector write and
-- every rebuild an index.
DROP INDEX transfers_view_user_created;
