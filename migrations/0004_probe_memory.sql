-- Where a probe's buffers were: 'host' memory, or GPU memory through CUDA ('cuda'). Rows from
-- before the column were host-memory probes.
ALTER TABLE probe_results
    ADD COLUMN memory text NOT NULL DEFAULT 'host' CHECK (memory IN ('host', 'cuda'));
