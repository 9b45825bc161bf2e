-- The fleet page (#15 item 4): each node's GPUs counted by status and its worst status, kept by
-- the assessment in the same transaction that writes the nodes' `gpu_status` rows (only for the
-- nodes whose rows changed), so the worst-first page is an index range instead of grouping every
-- GPU of the fleet per request, and the fleet totals add up one row a node. A node has its row
-- from its first batch (rank 0, no GPU assessed yet).
CREATE TABLE node_status (
    node_id     text    PRIMARY KEY REFERENCES nodes (node_id),
    gpus        bigint  NOT NULL DEFAULT 0,
    ok          bigint  NOT NULL DEFAULT 0,
    watch       bigint  NOT NULL DEFAULT 0,
    at_risk     bigint  NOT NULL DEFAULT 0,
    corrupting  bigint  NOT NULL DEFAULT 0,
    unverified  bigint  NOT NULL DEFAULT 0,
    -- The worst status of its GPUs (null before any is assessed), and its place in
    -- gpu_status_kind (0 without GPUs): the page's order and cursor.
    worst       gpu_status_kind,
    rank        integer NOT NULL DEFAULT 0
);
CREATE INDEX node_status_rank ON node_status (rank DESC, node_id);

-- Recounts the rows of `of_nodes` (every node when null) from `gpu_status`.
CREATE FUNCTION railguard_refresh_node_status(of_nodes text[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO node_status (node_id, gpus, ok, watch, at_risk, corrupting, unverified, worst, rank)
    SELECT n.node_id, count(g.gpu_index),
           count(*) FILTER (WHERE g.status = 'ok'),
           count(*) FILTER (WHERE g.status = 'watch'),
           count(*) FILTER (WHERE g.status = 'at_risk'),
           count(*) FILTER (WHERE g.status = 'corrupting'),
           count(*) FILTER (WHERE g.verification IN ('unprobed', 'unproven')),
           max(g.status),
           coalesce(array_position(enum_range(NULL::gpu_status_kind), max(g.status)), 0)
    FROM nodes n LEFT JOIN gpu_status g ON g.node_id = n.node_id
    WHERE of_nodes IS NULL OR n.node_id = ANY(of_nodes)
    GROUP BY n.node_id
    ON CONFLICT (node_id) DO UPDATE SET
        gpus = EXCLUDED.gpus, ok = EXCLUDED.ok, watch = EXCLUDED.watch, at_risk = EXCLUDED.at_risk,
        corrupting = EXCLUDED.corrupting, unverified = EXCLUDED.unverified, worst = EXCLUDED.worst,
        rank = EXCLUDED.rank
$$;
SELECT railguard_refresh_node_status(NULL);

CREATE FUNCTION railguard_node_status_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO node_status (node_id) VALUES (NEW.node_id) ON CONFLICT (node_id) DO NOTHING;
    RETURN NULL;
END;
$$;
CREATE TRIGGER nodes_status_row AFTER INSERT ON nodes FOR EACH ROW EXECUTE FUNCTION railguard_node_status_row();
