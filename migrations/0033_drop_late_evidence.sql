-- Nothing reads `nodes.late_evidence` any more: it marked a node for the assessment's kept
-- window, which the collector no longer has (every pass reads its nodes' window). The pattern
-- finder's kept periods go by `late_stored_at` (migration 0028).
ALTER TABLE nodes DROP COLUMN late_evidence;
