-- The leader changes this cell's ledger processes observed (ADR 0020 §5): of PostgreSQL (the
-- pool's watcher moved to another primary, `schema/src/failover.rs`) or of spot-core (a replica
-- answered as the leader of a higher epoch, `spot-core/src/client.rs`). One row per change and
-- per observing process; written after the move, from what the process buffered meanwhile.
-- `GET /api/v1/admin/cells` and the console show the last one. They move no money: rows, not
-- log entries.
CREATE TABLE failovers (
    id          bigserial   PRIMARY KEY,
    at          timestamptz NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('postgres', 'spot-core')),
    -- NULL when the process had seen no leader before (its first sight after a leaderless time).
    from_member text        NULL,
    to_member   text        NOT NULL,
    -- spot-core's epoch (the etcd key's create revision); NULL for PostgreSQL.
    epoch       bigint      NULL,
    cause       text        NOT NULL,
    -- Which process observed it (`ledger <pid>@<host>`).
    observed_by text        NOT NULL
);

CREATE INDEX failovers_by_kind_at ON failovers (kind, at DESC);
