-- A probe whose bytes a NIC's DMA moved, but not the pair's NIC (the transport's lanes name
-- another device, or none): `other_device`. The agent records it so, and the collector stores
-- any `nic_dma` record whose lanes do not name its NIC so (collector/src/ingest/carrier.rs).
ALTER TABLE probe_results DROP CONSTRAINT probe_results_path_check,
    ADD CONSTRAINT probe_results_path_check CHECK (path IN ('nic_dma', 'host_copy', 'simulated', 'other_device'));
ALTER TABLE probe_summaries DROP CONSTRAINT probe_summaries_path_check,
    ADD CONSTRAINT probe_summaries_path_check CHECK (path IN ('nic_dma', 'host_copy', 'simulated', 'other_device'));
ALTER TABLE probe_summary_sets DROP CONSTRAINT probe_summary_sets_path_check,
    ADD CONSTRAINT probe_summary_sets_path_check
        CHECK (path <@ ARRAY['nic_dma', 'host_copy', 'simulated', 'other_device']);

-- Records stored before the collector checked lanes: a `nic_dma` probe stored a row each whose
-- lanes name no RDMA device, or another device than its NIC, is what it is.
UPDATE probe_results SET path = 'other_device'
WHERE path = 'nic_dma'
  AND NOT (
      jsonb_typeof(lanes) = 'array'
      AND EXISTS (SELECT 1 FROM jsonb_array_elements_text(lanes) l
                  WHERE split_part(l, '/', 1) ~ '^(rc|dc|ud)(_|$)')
      AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(lanes) l
                      WHERE split_part(l, '/', 1) ~ '^(rc|dc|ud)(_|$)'
                        AND split_part(split_part(l, '/', 2), ':', 1) <> nic)
  );

-- The trust rule in SQL, for the reads that apply it there (the API's pairs and failures,
-- /metrics): what one record of probe evidence stands for. The same rule as
-- collector/src/evidence/trust.rs (`Class::standing`); e2e/tests/trust.rs checks the two agree
-- on every input. Inlined by the planner (SQL, immutable).
CREATE FUNCTION railguard_standing(path text, memory text, node_all_simulated boolean) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN path = 'nic_dma' AND memory = 'cuda' THEN 'nic_gpu_memory'
        WHEN path = 'nic_dma' THEN 'nic_host_memory'
        WHEN path = 'simulated' AND node_all_simulated THEN 'simulated'
        ELSE 'unproven'
    END
$$;

-- What carried the evidence a GPU's status rests on; whether its workload pair was proven on
-- hardware, through its own NIC, in the memory its KV cache moves in; whether its pin was
-- verified so (the alerts carry all three).
ALTER TABLE gpu_status
    ADD COLUMN evidence_path text CHECK (evidence_path IN ('nic_dma', 'host_copy', 'simulated', 'other_device')),
    ADD COLUMN proven boolean NOT NULL DEFAULT false,
    ADD COLUMN pin_verified boolean NOT NULL DEFAULT false;
