-- The GPUs a node has had that are no longer on its bus, as its agent's roll of GPUs keeps them
-- (`[{"index", "bdf", "uuid", "since_unix_s"}]`). Each keeps its index: its status, history and
-- taints stay its own and no other GPU of the node takes them. Empty from agents older than the
-- roll. The view lists the new column (a view's `*` is expanded when it is made).
ALTER TABLE topology_snapshots ADD COLUMN gone_gpus jsonb NOT NULL DEFAULT '[]';

CREATE OR REPLACE VIEW latest_topology AS
    SELECT DISTINCT ON (node_id) * FROM topology_snapshots ORDER BY node_id, received_at DESC, observed_at DESC;
