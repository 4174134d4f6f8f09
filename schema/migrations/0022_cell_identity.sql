-- Which cell this database is, and the partition map as it last accepted it (ADR 0016 §3).
-- Written once, at the first start-up under a cell map, in one transaction; every later
-- start-up compares the map it was given with these rows and refuses to serve on a difference,
-- naming the partition. A database served without a cell map leaves both tables empty.
CREATE TABLE cell_identity (
    only_row   boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    cell_id    integer     NOT NULL CHECK (cell_id BETWEEN 1 AND 65535),
    partitions integer     NOT NULL CHECK (partitions = 256),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE cell_partitions (
    partition smallint PRIMARY KEY CHECK (partition BETWEEN 0 AND 255),
    cell_id   integer  NOT NULL CHECK (cell_id BETWEEN 1 AND 65535)
);

-- The claim on an external_id across cells (ADR 0016 §6), kept in the cell that owns the
-- partition of the external_id's bytes and taken before the credit: the first user to name an
-- external_id holds it, and a deposit naming it under another user is refused, as one database's
-- `external_deposits` key refuses it. Empty without a cell map.
CREATE TABLE external_claims (
    external_id text        PRIMARY KEY,
    user_id     bigint      NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT now()
);
