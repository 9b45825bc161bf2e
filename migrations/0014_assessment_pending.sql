-- Incremental assessment (#15 item 3): a pass re-assesses only the nodes with new evidence and the
-- nodes whose evidence is leaving the window, not the whole fleet.
--
-- `evidence_pending` is set by every stored batch in the batch's own transaction (the same
-- statement that marks the node seen, so it costs no extra write) and cleared by the assessment
-- leader when it claims the node (`UPDATE … WHERE evidence_pending RETURNING node_id`), before it
-- reads the evidence. A flag is cleared only once committed, and it commits with its batch's
-- evidence, so a pass reads every batch whose flag it cleared; a batch still in flight is claimed
-- by this pass (if its node was already pending, the claim waits for it) or by the next. A node
-- registered before this migration starts pending: the first pass after it covers everyone.
-- (No index on the flag: one row a node, and an index on it would stop the per-batch update of
-- `nodes` from being a heap-only update.)
ALTER TABLE nodes ADD COLUMN evidence_pending boolean NOT NULL DEFAULT true;

-- The nodes whose evidence leaves the window between two passes are found by time alone; these
-- BRIN indexes serve that slice at a few bytes per thousand rows (probe_summaries has one).
CREATE INDEX probe_results_time ON probe_results USING brin (observed_at);
CREATE INDEX signal_events_time ON signal_events USING brin (observed_at);
CREATE INDEX inline_reports_time ON inline_reports USING brin (observed_at);
