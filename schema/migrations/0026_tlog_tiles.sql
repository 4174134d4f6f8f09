-- The tamper-evident log's hashes in tiles (docs/adr/0016-tamper-evident-log.md, "Storage"), as
-- Go's checksum database and C2SP tlog-tiles keep them, instead of one row per perfect subtree.
--
-- A tile of height 8 at tile level `level` and index `idx` holds the hashes of the tree's level
-- 8 * level at positions idx * 256 .. idx * 256 + w - 1 (1 <= w <= 256; the rightmost tile of a
-- level is partial and grows), concatenated: 32 * w bytes. Level 0 holds the leaves' hashes (leaf
-- index = feed position - 1). A subtree between tile levels is the fold of at most 128 hashes of
-- one tile; the follower appends each pass's new hashes to the tiles they belong to, in the
-- transaction that moves the head. Rows are inserted, then only appended to.
CREATE TABLE tlog_tiles
(
    level  smallint NOT NULL CHECK (level BETWEEN 0 AND 7),
    idx    bigint   NOT NULL CHECK (idx >= 0),
    hashes bytea    NOT NULL CHECK (length(hashes) BETWEEN 32 AND 8192
                                    AND length(hashes) % 32 = 0),
    PRIMARY KEY (level, idx)
);
-- Hashes do not compress: never try (pglz would spend CPU on every write to give up), and keep
-- the value uncompressed out of line so a proof's `substring` reads only the chunks it needs.
ALTER TABLE tlog_tiles ALTER COLUMN hashes SET STORAGE EXTERNAL;

-- An existing tree: its stored subtrees of levels 0, 8, 16... become tiles, the others (between
-- tile levels) are dropped: they are folds of what the tiles keep. Every stored level's subtrees
-- are dense from index 0 (the follower stored each one as the tree completed it), so grouping
-- by idx / 256 in index order gives each tile's bytes in order.
DO $$
DECLARE
    gap record;
BEGIN
    SELECT level, min(idx) AS first, max(idx) AS last, count(*) AS n INTO gap
    FROM tlog_nodes WHERE level % 8 = 0 GROUP BY level
    HAVING min(idx) <> 0 OR max(idx) + 1 <> count(*) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'tlog_nodes level % is not dense (% rows from % to %): not converted',
            gap.level, gap.n, gap.first, gap.last;
    END IF;
END $$;

INSERT INTO tlog_tiles (level, idx, hashes)
SELECT level / 8, idx / 256, string_agg(hash, ''::bytea ORDER BY idx)
FROM tlog_nodes
WHERE level % 8 = 0
GROUP BY level / 8, idx / 256;

DROP TABLE tlog_nodes;
