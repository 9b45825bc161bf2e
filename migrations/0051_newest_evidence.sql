-- Each node's newest evidence date (of its probe records, summary sets, signals and in-line
-- reports), kept by every stored batch in the batch's transaction. A pass finds the nodes with
-- evidence entering the window between it and the pass before (dated after that pass: stored
-- ahead of its date, by an agent clock running fast, or while that pass was claiming) from this
-- column, not by reading every record dated between the two passes: a rolling start stores a
-- node's full probes at once, hundreds of thousands of rows a pass at 100,000 nodes. (No index:
-- the per-batch update of `nodes` stays a heap-only update; the pass scans `nodes` as its claim
-- does.)
ALTER TABLE nodes ADD COLUMN newest_evidence_at timestamptz;

-- The nodes' evidence of the last hour and ahead, as the column would have kept it: older
-- evidence has entered every window already.
UPDATE nodes n SET newest_evidence_at = e.newest
FROM (SELECT node_id, max(observed_at) AS newest FROM (
          SELECT node_id, observed_at FROM probe_results WHERE observed_at > now() - interval '1 hour'
          UNION ALL SELECT node_id, observed_at FROM probe_summary_sets WHERE observed_at > now() - interval '1 hour'
          UNION ALL SELECT node_id, observed_at FROM signal_events WHERE observed_at > now() - interval '1 hour'
          UNION ALL SELECT node_id, observed_at FROM inline_reports WHERE observed_at > now() - interval '1 hour'
      ) r GROUP BY node_id) e
WHERE e.node_id = n.node_id;
