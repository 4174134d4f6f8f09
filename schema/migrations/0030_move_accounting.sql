-- Moving a partition, second part (ADR 0023 §4-§5): the drain before the freeze, the copies
-- marked so that the conservation check never counts them, the partition of a FUNDING account
-- stored, and the FUNDING totals each cell records at the switch.

-- DRAINING: the partition's users can start nothing new (no transfer, deposit, client key or
-- daily charge), while the transfers already open go on to their end; the freeze follows once
-- none is open, so no transfer is ever carried from one cell to the other half-done.
ALTER TABLE cell_partitions DROP CONSTRAINT cell_partitions_state_check;
ALTER TABLE cell_partitions ADD CONSTRAINT cell_partitions_state_check
    CHECK (state IN ('STEADY', 'DRAINING', 'FROZEN', 'INCOMING'));

-- A row copied in by a move names it: the conservation check counts a cell's own rows, and a
-- partition's past arrives at the switch as one total (`partition_switches`), never row by row.
ALTER TABLE funding_journal ADD COLUMN move_id text;
ALTER TABLE external_deposits ADD COLUMN move_id text;

-- The check sums FUNDING balances of the partitions the cell owns, and a move copies one
-- partition's accounts: both read the partition from its own column, not a hash per row.
ALTER TABLE funding_accounts
    ADD COLUMN partition smallint GENERATED ALWAYS AS (user_partition(user_id)::smallint) STORED;
CREATE INDEX funding_accounts_partition ON funding_accounts (partition);

-- What the switch moved between the cells' FUNDING books: per move and asset, the FUNDING
-- balances of the partition at the switch, recorded in the same transaction as the map's flip
-- (OUT in the source, IN in the target), each from the cell's own rows. With the engines'
-- `move_out`/`move_in` records (the SPOT side, from spot-core's journal) they are the
-- conservation check's "moved" term: FUNDING + SPOT + in flight = deposits + moved.
CREATE TABLE partition_switches (
    move_id     text            NOT NULL,
    direction   text            NOT NULL CHECK (direction IN ('IN', 'OUT')),
    asset       text            NOT NULL,
    partition   smallint        NOT NULL CHECK (partition BETWEEN 0 AND 255),
    funding     numeric(38, 18) NOT NULL,
    switched_at timestamptz     NOT NULL DEFAULT now(),
    PRIMARY KEY (move_id, direction, asset)
);

-- The fence, with creations told apart: `starting` users' writes pass only in a STEADY
-- partition of this cell, `going` users' (a transfer already open: its later events and its
-- FUNDING movements) in a DRAINING one too.
CREATE FUNCTION partition_fence_split(starting bigint[], going bigint[]) RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    me      integer;
    parts   integer[];
    new_parts integer[];
    p       integer;
    copying text := nullif(current_setting('ledger.move_copy', true), '');
    bad     record;
BEGIN
    SELECT cell_id INTO me FROM cell_identity;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    new_parts := ARRAY(SELECT DISTINCT user_partition(u) FROM unnest(starting) AS u
                       WHERE u IS NOT NULL);
    parts := ARRAY(SELECT DISTINCT x FROM (
                       SELECT unnest(new_parts) AS x
                       UNION
                       SELECT user_partition(u) FROM unnest(going) AS u WHERE u IS NOT NULL) s
                   ORDER BY 1);
    FOREACH p IN ARRAY parts LOOP
        PERFORM pg_advisory_xact_lock_shared(1297045061, p);
    END LOOP;
    SELECT cp.partition, cp.cell_id, cp.state INTO bad
    FROM cell_partitions cp
    WHERE cp.partition = ANY (parts)
      AND NOT (cp.cell_id = me AND cp.state = 'STEADY')
      AND NOT (cp.cell_id = me AND cp.state = 'DRAINING' AND NOT cp.partition = ANY (new_parts))
      AND NOT (cp.state = 'INCOMING' AND coalesce(cp.move_id = copying, false))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'partition % is not this cell''s to write (owner cell %, %): route again under the current map',
            bad.partition, bad.cell_id, bad.state
            USING ERRCODE = 'LC002';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION partition_fence(users bigint[]) RETURNS void
    LANGUAGE sql
AS $$ SELECT partition_fence_split(users, '{}') $$;

-- Events: a first event (sequence 1) starts something; a later one continues it.
CREATE FUNCTION partition_fence_events() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM partition_fence_split(
        ARRAY(SELECT DISTINCT user_id FROM written WHERE sequence = 1),
        ARRAY(SELECT DISTINCT user_id FROM written WHERE sequence > 1));
    RETURN NULL;
END
$$;

-- The FUNDING journal: a movement of a transfer that exists (its creation passed the fence
-- before), so it continues in a DRAINING partition; an external deposit's own row in
-- `external_deposits` is what a drain refuses.
CREATE FUNCTION partition_fence_going() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM partition_fence_split('{}', ARRAY(SELECT DISTINCT user_id FROM written));
    RETURN NULL;
END
$$;

DROP TRIGGER events_fence ON events;
CREATE TRIGGER events_fence AFTER INSERT ON events
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION partition_fence_events();
DROP TRIGGER funding_journal_fence ON funding_journal;
CREATE TRIGGER funding_journal_fence AFTER INSERT ON funding_journal
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION partition_fence_going();

-- The open transfers of a partition (created by its users, not yet ended).
CREATE FUNCTION partition_open_transfers(part integer) RETURNS bigint
    LANGUAGE sql STABLE
AS $$
    SELECT count(*) FROM open_transfers o
    JOIN events c ON c.aggregate_type = 'Transfer' AND c.aggregate_id = o.req_id
                 AND c.sequence = 1
    WHERE user_partition(c.user_id) = part
$$;

-- The drain: this cell's STEADY partition becomes DRAINING for move `id`, under the fence's
-- lock taken exclusively (it waits for every write that passed the fence). Answers the state.
CREATE FUNCTION partition_drain(part integer, id text) RETURNS text
    LANGUAGE plpgsql
AS $$
DECLARE
    found_state text;
BEGIN
    PERFORM pg_advisory_xact_lock(1297045061, part);
    UPDATE cell_partitions cp SET state = 'DRAINING', move_id = id
    FROM cell_identity ci
    WHERE cp.partition = part AND cp.cell_id = ci.cell_id AND cp.state = 'STEADY';
    SELECT state INTO found_state FROM cell_partitions WHERE partition = part;
    RETURN found_state;
END
$$;

-- The freeze: this cell's partition, DRAINING for move `id` with no transfer open, becomes
-- FROZEN under the exclusive lock. Answers the state it leaves (DRAINING while some transfer
-- is open).
CREATE OR REPLACE FUNCTION partition_freeze(part integer, id text) RETURNS text
    LANGUAGE plpgsql
AS $$
DECLARE
    found_state text;
BEGIN
    PERFORM pg_advisory_xact_lock(1297045061, part);
    UPDATE cell_partitions cp SET state = 'FROZEN'
    FROM cell_identity ci
    WHERE cp.partition = part AND cp.cell_id = ci.cell_id AND cp.state = 'DRAINING'
      AND cp.move_id = id AND partition_open_transfers(part) = 0;
    SELECT state INTO found_state FROM cell_partitions WHERE partition = part;
    RETURN found_state;
END
$$;

-- The switch, in one cell, in one transaction: the partition's row names `to_cell`, STEADY;
-- the source records its FUNDING totals of the partition leaving (OUT), the target the totals
-- of what it copied arriving (IN); the map's version rises to `version`. Idempotent: a second
-- call finds the row switched and records nothing. Answers whether this call switched it.
CREATE FUNCTION partition_switch(part integer, id text, to_cell integer, version bigint)
    RETURNS boolean
    LANGUAGE plpgsql
AS $$
DECLARE
    me    integer;
    row_  record;
    dir   text;
BEGIN
    SELECT cell_id INTO me FROM cell_identity;
    PERFORM pg_advisory_xact_lock(1297045061, part);
    SELECT cell_id, state, move_id INTO row_ FROM cell_partitions WHERE partition = part FOR UPDATE;
    IF row_.cell_id = to_cell AND row_.state = 'STEADY' THEN
        UPDATE cell_identity SET map_version = greatest(map_version, version);
        RETURN false;
    END IF;
    IF row_.state = 'FROZEN' AND row_.cell_id = me AND row_.move_id = id THEN
        dir := 'OUT';
    ELSIF row_.state = 'INCOMING' AND row_.move_id = id AND me = to_cell THEN
        dir := 'IN';
    ELSIF row_.state = 'STEADY' THEN
        dir := NULL;
    ELSE
        RAISE EXCEPTION 'partition % is % for move %, not switchable by move %',
            part, row_.state, row_.move_id, id USING ERRCODE = 'LC003';
    END IF;
    IF dir IS NOT NULL THEN
        INSERT INTO partition_switches (move_id, direction, asset, partition, funding)
        SELECT id, dir, asset, part, sum(balance) FROM funding_accounts
        WHERE partition = part GROUP BY asset
        ON CONFLICT DO NOTHING;
    END IF;
    UPDATE cell_partitions SET cell_id = to_cell, state = 'STEADY', move_id = NULL
    WHERE partition = part;
    UPDATE cell_identity SET map_version = greatest(map_version, version);
    RETURN true;
END
$$;

-- Recovery drives a DRAINING partition's open transfers: the drain waits for them.
CREATE OR REPLACE FUNCTION transfer_is_ours(req_id text) RETURNS boolean
    LANGUAGE sql STABLE
AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM events c, cell_partitions cp, cell_identity ci
        WHERE c.aggregate_type = 'Transfer' AND c.aggregate_id = transfer_is_ours.req_id
          AND c.sequence = 1 AND cp.partition = user_partition(c.user_id)
          AND NOT (cp.cell_id = ci.cell_id AND cp.state IN ('STEADY', 'DRAINING')))
$$;

-- The conservation check's checkpoint keeps the SPOT balances moved in minus out that it
-- consumed from spot-core's journal (ADR 0023 §5).
ALTER TABLE audit_checkpoint_assets ADD COLUMN moved numeric NOT NULL DEFAULT 0;
