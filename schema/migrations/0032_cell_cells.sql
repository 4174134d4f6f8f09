-- Cells added while a deployment serves (ADR 0023 §1, `ledger cells add`). Every cell keeps the
-- cells added after its map file, with what reaching each takes, so that a process started from
-- the old file (or `ledger up --cells N` again) finds and serves them; the file's own cells are
-- not here, the file names them. `database_url` NULL: the database `ledger up --cells N` makes
-- beside the others (`<name>_cell<id>` on DATABASE_URL's server), so that no password of the
-- process's own URL is written here. `spot` is `HOST:PORT` or `start` (a child of `ledger up`).
-- `map_version`: the version whose write named the cell (its `CellAdded` entry's).
CREATE TABLE cell_cells (
    id              integer PRIMARY KEY CHECK (id BETWEEN 1 AND 65535),
    database_url    text,
    spot            text NOT NULL CHECK (spot <> ''),
    spot_token_file text,
    map_version     bigint NOT NULL CHECK (map_version >= 1),
    added_at        timestamptz NOT NULL DEFAULT now()
);
