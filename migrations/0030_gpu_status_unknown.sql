-- `unknown`: a GPU of a node whose stored inputs could not be assessed (a row no ingest would
-- accept, or an assessment that failed on the node's evidence). It sorts after `watch` and before
-- `at_risk`: nothing is known against the GPU, and nothing for it either. Its use waits for the
-- next migration (a new enum value is usable once the transaction adding it has committed).
ALTER TYPE gpu_status_kind ADD VALUE IF NOT EXISTS 'unknown' AFTER 'watch';
