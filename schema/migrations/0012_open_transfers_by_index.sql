-- The statement trigger that keeps `open_transfers` (0007) found the rows to delete with a
-- sequential scan: its plan is cached for the session, and it was made when the table was small
-- (freshly vacuumed, or never analyzed). Every transfer leaves three row versions in that table,
-- so between two vacuums the scan read hundreds of thousands of dead ones on every append: 15% of
-- the whole machine's CPU in `ledger-bench transfers` (perf), a third of PostgreSQL's. The live
-- rows are few and every lookup is by `req_id`, which the primary key serves whatever the
-- statistics say; the trigger now plans without sequential scans (a setting of the function
-- alone, restored when it returns).
ALTER FUNCTION track_open_transfers() SET enable_seqscan = off;
