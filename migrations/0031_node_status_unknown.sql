-- The fleet page's per-node counts gain the GPUs not assessed (`unknown`, migration 0030), and
-- every node is recounted: `rank` is the worst status's place in gpu_status_kind, which the new
-- value moved for `at_risk` and `corrupting`.
ALTER TABLE node_status ADD COLUMN unknown bigint NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION railguard_refresh_node_status(of_nodes text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF of_nodes IS NULL THEN
        of_nodes := ARRAY(SELECT node_id FROM nodes);
    END IF;
    INSERT INTO node_status (node_id, gpus, ok, watch, unknown, at_risk, corrupting, unverified, worst, rank)
    SELECT n.node_id, count(g.gpu_index),
           count(*) FILTER (WHERE g.status = 'ok'),
           count(*) FILTER (WHERE g.status = 'watch'),
           count(*) FILTER (WHERE g.status = 'unknown'),
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
        gpus = EXCLUDED.gpus, ok = EXCLUDED.ok, watch = EXCLUDED.watch, unknown = EXCLUDED.unknown,
        at_risk = EXCLUDED.at_risk, corrupting = EXCLUDED.corrupting, unverified = EXCLUDED.unverified,
        worst = EXCLUDED.worst, rank = EXCLUDED.rank;
END;
$$;

SELECT railguard_refresh_node_status(NULL);
