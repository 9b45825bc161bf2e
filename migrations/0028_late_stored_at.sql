-- The pattern finder's kept periods (#15, collector/src/assess/window.rs `PeriodCache`): like the
-- assessment's rolling window, each relative period of `/api/v1/patterns` (the dashboard's 15
-- minutes, the API's default hour) is kept between reads and moved forward by the evidence that
-- entered and left it. Evidence stored long after it was observed is not in what was kept; the
-- assessment's flag (`late_evidence`) is cleared by the pass that reads the node again, so the
-- pattern finder needs its own mark: when ingest last stored late evidence of the node (the
-- batch's transaction time; null: never). A read re-reads in full the nodes marked since the
-- read before it. (No index: the per-batch update of `nodes` stays a heap-only update; the read
-- scans `nodes`, 10,000 rows at fleet scale.)
ALTER TABLE nodes ADD COLUMN late_stored_at timestamptz;
