-- The partition fence's cost per append statement (ADR 0023 §2, migration 0029), measured in the
-- database alone: 3,000 INSERTs of 32 events each, one statement at a time inside one function.
-- Run it against a scratch database migrated by the ledger (never a real cell's), in three
-- arms, alternating, and compare the times in one sitting:
--
--   P="psql -h 127.0.0.1 -U postgres -d SCRATCH -q"
--   $P -c "ALTER TABLE events DISABLE TRIGGER events_fence"                 # off
--   $P -c "ALTER TABLE events ENABLE TRIGGER events_fence; DELETE FROM cell_identity"  # no map
--   $P -c "INSERT INTO cell_identity (cell_id, partitions) VALUES (1, 256);
--          INSERT INTO cell_partitions (partition, cell_id)
--          SELECT p, 1 FROM generate_series(0, 255) p ON CONFLICT DO NOTHING"  # a map
--   $P -f bench/sql/partition_fence.sql
\timing on
CREATE TEMP SEQUENCE bench_fence_seq;
CREATE OR REPLACE FUNCTION pg_temp.bench_fence(n int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE i int;
BEGIN
  FOR i IN 1..n LOOP
    INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version,
                        payload, metadata, user_id)
    SELECT 'Bench', 'b' || clock_timestamp()::text || nextval('bench_fence_seq'), 1, 'X', '1',
           '{}'::json, '{}'::json, 1000 + (g % 32)
    FROM generate_series(1, 32) g;
  END LOOP;
END $$;
SELECT pg_temp.bench_fence(3000);
