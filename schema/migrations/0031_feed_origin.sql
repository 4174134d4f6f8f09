-- The feed shows where a partition move's copy of an event came from (ADR 0023 §5): the source
-- cell, its position there and the move, from the copy's metadata; null for an event this cell
-- appended itself. A consumer of several cells' feeds skips a copy it saw in its source.
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
       e.recorded_at,
       (e.metadata ->> 'origin_cell')::bigint AS origin_cell,
       (e.metadata ->> 'origin_position')::bigint AS origin_position,
       e.metadata ->> 'origin_move' AS origin_move
FROM events e;
