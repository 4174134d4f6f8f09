-- Moving a partition (ADR 0023): the partition states, the moves' records, and the fence.
--
-- Every cell keeps the whole map in `cell_partitions` (migration 0022). A partition is this
-- cell's to write when its row names this cell and its state is STEADY. A move freezes it in
-- its source (FROZEN), marks it INCOMING in its target while copying, and at the switch names
-- the target in every cell's row (the source's rows stay, no longer counted).
ALTER TABLE cell_partitions
    ADD COLUMN state   text NOT NULL DEFAULT 'STEADY'
        CHECK (state IN ('STEADY', 'FROZEN', 'INCOMING')),
    ADD COLUMN move_id text,
    ADD CHECK ((state = 'STEADY') = (move_id IS NULL));

-- One row per move, in its source cell; `record` holds the runner's progress (marks, counts,
-- the SPOT balances moved out, the cancel's step and reason). Two moves of one partition never
-- run at once: the partial unique index refuses the second while the first has not ended.
CREATE TABLE partition_moves (
    id          text        PRIMARY KEY,
    partition   smallint    NOT NULL CHECK (partition BETWEEN 0 AND 255),
    from_cell   integer     NOT NULL CHECK (from_cell BETWEEN 1 AND 65535),
    to_cell     integer     NOT NULL CHECK (to_cell BETWEEN 1 AND 65535 AND to_cell <> from_cell),
    step        text        NOT NULL CHECK (step IN ('PLANNED', 'COPYING', 'CATCHING_UP',
                                                    'PAUSING', 'MOVING_SPOT', 'VERIFYING',
                                                    'SWITCHING', 'DONE', 'CANCELLING',
                                                    'CANCELLED')),
    map_version bigint      NOT NULL CHECK (map_version >= 2),
    record      jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX partition_moves_one_at_a_time ON partition_moves (partition)
    WHERE step NOT IN ('DONE', 'CANCELLED');

-- ADR 0017 §2's partition of a user, in SQL: the 8th byte of SHA-256 of its decimal id.
CREATE FUNCTION user_partition(user_id bigint) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT get_byte(sha256(convert_to(user_id::text, 'UTF8')), 7) $$;

-- The fence (ADR 0023 §2). A write of users' money or events passes only for partitions this
-- cell owns and has not frozen; it takes a shared advisory lock per partition first, held to
-- its commit, and a freeze takes the same lock exclusively: the freeze waits for every write
-- that passed, and every write after the freeze sees it. Without a cell map (no identity row)
-- nothing is checked or locked. The copy of a move writes into an INCOMING partition under
-- `SET LOCAL ledger.move_copy = <move id>`. SQLSTATE LC002: route again under the current map.
CREATE FUNCTION partition_fence(users bigint[]) RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    me      integer;
    parts   integer[];
    p       integer;
    copying text := nullif(current_setting('ledger.move_copy', true), '');
    bad     record;
BEGIN
    SELECT cell_id INTO me FROM cell_identity;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    parts := ARRAY(SELECT DISTINCT user_partition(u) FROM unnest(users) AS u
                   WHERE u IS NOT NULL ORDER BY 1);
    FOREACH p IN ARRAY parts LOOP
        PERFORM pg_advisory_xact_lock_shared(1297045061, p);
    END LOOP;
    SELECT cp.partition, cp.cell_id, cp.state INTO bad
    FROM cell_partitions cp
    WHERE cp.partition = ANY (parts)
      AND NOT (cp.cell_id = me AND cp.state = 'STEADY')
      AND NOT (cp.state = 'INCOMING' AND coalesce(cp.move_id = copying, false))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'partition % is not this cell''s to write (owner cell %, %): route again under the current map',
            bad.partition, bad.cell_id, bad.state
            USING ERRCODE = 'LC002';
    END IF;
END
$$;

CREATE FUNCTION partition_fence_rows() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM partition_fence(ARRAY(SELECT DISTINCT user_id FROM written));
    RETURN NULL;
END
$$;

CREATE TRIGGER events_fence AFTER INSERT ON events
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION partition_fence_rows();
CREATE TRIGGER funding_journal_fence AFTER INSERT ON funding_journal
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION partition_fence_rows();
CREATE TRIGGER external_deposits_fence AFTER INSERT ON external_deposits
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION partition_fence_rows();
CREATE TRIGGER transfer_cids_fence AFTER INSERT ON transfer_cids
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION partition_fence_rows();
CREATE TRIGGER daily_counts_fence_insert AFTER INSERT ON daily_transfer_counts
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION partition_fence_rows();
CREATE TRIGGER daily_counts_fence_update AFTER UPDATE ON daily_transfer_counts
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION partition_fence_rows();
CREATE TRIGGER daily_amounts_fence_insert AFTER INSERT ON daily_transfer_amounts
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION partition_fence_rows();
CREATE TRIGGER daily_amounts_fence_update AFTER UPDATE ON daily_transfer_amounts
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION partition_fence_rows();

-- The freeze: this cell's partition, STEADY, becomes FROZEN for move `id`, under the fence's
-- lock taken exclusively (it waits for every write that passed the fence). Answers the state
-- it leaves: FROZEN, or what it found when the partition is not this cell's STEADY one.
CREATE FUNCTION partition_freeze(part integer, id text) RETURNS text
    LANGUAGE plpgsql
AS $$
DECLARE
    found_state text;
BEGIN
    PERFORM pg_advisory_xact_lock(1297045061, part);
    UPDATE cell_partitions cp SET state = 'FROZEN', move_id = id
    FROM cell_identity ci
    WHERE cp.partition = part AND cp.cell_id = ci.cell_id AND cp.state = 'STEADY';
    SELECT state INTO found_state FROM cell_partitions WHERE partition = part;
    RETURN found_state;
END
$$;

-- Whether an open transfer is this cell's to drive: always without a map; under one, when its
-- owner's partition is this cell's and STEADY (recovery's due list skips the others, so a
-- transfer copied in by a move is not driven by its target before the switch, nor by its
-- source after it).
CREATE FUNCTION transfer_is_ours(req_id text) RETURNS boolean
    LANGUAGE sql STABLE
AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM events c, cell_partitions cp, cell_identity ci
        WHERE c.aggregate_type = 'Transfer' AND c.aggregate_id = transfer_is_ours.req_id
          AND c.sequence = 1 AND cp.partition = user_partition(c.user_id)
          AND NOT (cp.cell_id = ci.cell_id AND cp.state = 'STEADY'))
$$;
