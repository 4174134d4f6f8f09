-- The tamper-evident log (docs/adr/0016-tamper-evident-log.md): an RFC 6962 Merkle tree over the
-- feed, in feed order, kept by one follower (`tlog-follower`) from committed events, and the
-- signed checkpoints it makes. The event table is not touched: appends never wait for the tree.
--
-- Every perfect subtree, once complete, is stored by (level, index): level 0 holds the leaves'
-- hashes (leaf index = feed position - 1), level k the subtree of 2^k leaves starting at leaf
-- index << k. A proof is a fold of O(log n) of them; nothing is ever re-hashed to answer one.
-- Rows are only inserted.
CREATE TABLE tlog_nodes
(
    level smallint NOT NULL CHECK (level BETWEEN 0 AND 62),
    idx   bigint   NOT NULL CHECK (idx >= 0),
    hash  bytea    NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (level, idx)
);

-- The tree's head: its size, its right edge (the hashes of the perfect subtrees its size
-- decomposes into, largest first, concatenated) and root, and the identity that signs it: the
-- origin (the signing key's name) and the verifier key. One row; the follower writes it under its
-- lock, in the transaction that stores the nodes it adds.
CREATE TABLE tlog_state
(
    one             boolean     PRIMARY KEY DEFAULT true CHECK (one),
    origin          text,
    vkey            text,
    size            bigint      NOT NULL DEFAULT 0 CHECK (size >= 0),
    edge            bytea       NOT NULL DEFAULT ''::bytea,
    root            bytea       NOT NULL CHECK (length(root) = 32),
    checkpointed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO tlog_state (root)
VALUES (decode('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855', 'hex'));

-- Every signed checkpoint (C2SP tlog-checkpoint in a signed note), by tree size.
CREATE TABLE tlog_checkpoints
(
    size       bigint      PRIMARY KEY CHECK (size >= 0),
    root       bytea       NOT NULL CHECK (length(root) = 32),
    note       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
