-- The assessment's rolling window (#15 item 3, collector/src/assess/window.rs): the leading
-- collector keeps each node's evidence of the window in memory, moving it forward every pass by
-- the evidence that entered and left the window, instead of reading a node's whole window again
-- each time the node is assessed. That holds for evidence stored soon after it was observed; a
-- batch carrying evidence observed more than 90 s before it is stored (an agent's spool replayed
-- after an outage, a clock behind) marks its node here, and the next pass that assesses the node
-- reads its window again in full. Set by ingest in the batch's transaction; cleared by the pass
-- that reads the node again. (No index, like `assessed_at`: the per-batch update of `nodes`
-- stays a heap-only update.)
ALTER TABLE nodes ADD COLUMN late_evidence boolean NOT NULL DEFAULT false;

-- The fleet page's recount for some nodes, planned for them: as one SQL statement with
-- `of_nodes IS NULL OR node_id = ANY(of_nodes)` it was planned once for both, scanning every GPU
-- of the fleet (0.4 s for 1,000 nodes of 10,000 on a 2-core machine, where the same recount
-- through the primary key takes 0.03 s). The whole fleet (null) is the list of every node.
CREATE OR REPLACE FUNCTION railguard_refresh_node_status(of_nodes text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF of_nodes IS NULL THEN
        of_nodes := ARRAY(SELECT node_id FROM nodes);
    END IF;
    INSERT INTO node_status (node_id, gpus, ok, watch, at_risk, corrupting, unverified, worst, rank)
    SELECT n.node_id, count(g.gpu_index),
           count(*) FILTER (WHERE g.status = 'ok'),
           count(*) FILTER (WHERE g.status = 'watch'),
           count(*) FILTER (WHERE g.status = 'at_risk'),
           count(*) FILTER (WHERE g.status = 'corrupting'),
           count(*) FILTER (WHERE g.verification IN ('unprobed', 'unproven')),
           max(g.status),
           coalesce(array_position(enum_range(NULL::gpu_status_kind), max(g.status)), 0)
    FROM (SELECT DISTINCT unnest(of_nodes) AS node_id) u
         JOIN nodes n ON n.node_id = u.node_id
         LEFT JOIN gpu_status g ON g.node_id = n.node_id
    GROUP BY n.node_id
    ON CONFLICT (node_id) DO UPDATE SET
        gpus = EXCLUDED.gpus, ok = EXCLUDED.ok, watch = EXCLUDED.watch, at_risk = EXCLUDED.at_risk,
        corrupting = EXCLUDED.corrupting, unverified = EXCLUDED.unverified, worst = EXCLUDED.worst,
        rank = EXCLUDED.rank;
END;
$$;
