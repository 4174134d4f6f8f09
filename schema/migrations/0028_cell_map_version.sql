-- The cell map's version (ADR 0023 §1): 1 for the map a cell was first given; a partition move
-- or a cell's addition writes the next one into every cell. The ledger sends it in spot-core's
-- `hello` (ADR 0020 §4), and a spot-core that has seen a newer one refuses the hello
-- (`STALE_MAP`), so a process that missed a switch cannot write through it.
ALTER TABLE cell_identity
    ADD COLUMN map_version bigint NOT NULL DEFAULT 1 CHECK (map_version >= 1);
