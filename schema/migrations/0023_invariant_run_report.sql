-- Each conservation run names its full report: `invariant_runs.report_id` is the id of the
-- `invariant_checks` row written by the same check (`application::audit::history`), so the admin
-- API serves a run's whole report (`GET /api/v1/admin/invariant/runs/{id}`). Null for a run
-- recorded before this column existed. No foreign key: each table is pruned to its own bound, and
-- a run whose report has been pruned answers 404.
ALTER TABLE invariant_runs ADD COLUMN report_id bigint;
