-- The evidence stored a record a row (full probes, and the single summaries of agents from
-- before summary sets), as `probe_evidence` shows it, without the summary sets. An assessment
-- pass reads these in SQL and reads `probe_summary_sets` as rows of arrays, adding each set's
-- summaries up itself (collector/src/assess/window.rs): unnesting every set's 64 summaries into
-- rows and grouping them took 1.1 s of a pass over 600 nodes on this 2-core machine, where
-- reading the same sets as arrays takes 0.09 s (docs/scaling.md).
CREATE VIEW probe_row_evidence AS
    SELECT node_id, observed_at, gpu_index, nic, transport, memory, path, injected, lanes, verdict, diagnosis,
           1 AS probes
    FROM probe_results
    UNION ALL
    SELECT node_id, observed_at, gpu_index, nic, transport, memory, path, injected, lanes, 'ok', 'none', probes
    FROM probe_summaries;
