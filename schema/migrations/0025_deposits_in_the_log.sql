-- External deposits become entries of the tamper-evident log (docs/adr/0016-tamper-evident-log.md,
-- issue 36): money entering the system is an event of the event table, so the feed carries it,
-- the Merkle tree covers it, and `ledger verify` can hold every `external_deposits` row to its
-- entry. A deposit's entry: aggregate `Deposit`, id its external_id, sequence 1, event
-- `ExternalDeposited` version 1, owned by its user, at the deposit's time.
--
-- The deposit's own transaction appends it (`adapters::FundingLedger::external_deposit`, through
-- `deposit_entries_append` below), after its balance, so the row, the balance and the entry commit
-- together or not at all. Deposits made before this migration get theirs here, at the log's end,
-- in external_id order (byte order, whatever the database's collation): feed positions are
-- never moved, so these entries come after every event already in the log, whatever their times.

-- A deposit's payload, from its row: the one text of it for the live path and this migration.
-- Compact JSON in this key order, every value a string: the amount in plain decimal without
-- trailing zeros (as the API answers amounts), the time the row's, in UTC with six fractional
-- digits (as the feed's `occurred_at`). Stored as this exact text, so the entry hashes it.
CREATE FUNCTION deposit_entry_payload(external_id text, asset text, amount numeric,
                                      at timestamptz) RETURNS json
    LANGUAGE sql STABLE
AS $$
SELECT format('{"ExternalDeposited":{"external_id":%s,"asset":%s,"amount":%s,"at":%s}}',
              to_json(external_id)::text, to_json(asset)::text,
              to_json(trim_scale(amount)::text)::text,
              to_json(to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))::text)::json
$$;

-- Appends the entries of the deposits `ids` names (rows of `external_deposits` visible to the
-- caller), in the array's order, at the feed's next positions; returns the last position.
--
-- The positions are taken under the feed's lock (`feed_take()`, migration 0015), held until the
-- caller's transaction ends, exactly as every event append takes them, so the feed stays dense
-- and in commit order. The caller must take it last, after every row lock it needs (a deposit:
-- its account's): see `adapters/src/funding/accounts.rs` for why no lock cycle can form.
CREATE FUNCTION deposit_entries_append(ids text[]) RETURNS bigint
    LANGUAGE sql VOLATILE
AS $$
WITH head AS MATERIALIZED (SELECT feed_take() AS before),
     todo AS (SELECT d.external_id, d.user_id, d.asset, d.amount, d.created_at,
                     row_number() OVER (ORDER BY u.n) AS n
              FROM unnest(ids) WITH ORDINALITY AS u(id, n)
                   JOIN external_deposits d ON d.external_id = u.id),
     added AS (
         INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version,
                             payload, metadata, user_id, occurred_at, feed_position)
         SELECT 'Deposit', todo.external_id, 1, 'ExternalDeposited', '1',
                deposit_entry_payload(todo.external_id, todo.asset, todo.amount, todo.created_at),
                json_build_object('user_id', todo.user_id), todo.user_id, todo.created_at,
                head.before + todo.n
         FROM head, todo
         RETURNING feed_position)
SELECT max(feed_position) FROM added
$$;

-- No deposit commits while the earlier ones get their entries (a deposit of a ledger still
-- running the code before this migration would have no entry: stop every ledger to upgrade).
LOCK TABLE external_deposits IN SHARE ROW EXCLUSIVE MODE;

SELECT deposit_entries_append(ARRAY(SELECT external_id FROM external_deposits
                                    ORDER BY external_id COLLATE "C"));
