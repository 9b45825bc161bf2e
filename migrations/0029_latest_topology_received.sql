-- Which topology snapshot is a node's latest is decided by the collector's clock: the one it
-- received last (`received_at`, the storing transaction's time), ties within one batch broken by
-- the agent's time. An agent's `observed_at` is bounded at ingest to a few minutes ahead of the
-- collector, but ordering by it would still let a snapshot dated ahead outrank the agent's later
-- genuine ones until the agent's clock caught up with it.
CREATE INDEX topology_snapshots_node_received ON topology_snapshots (node_id, received_at DESC, observed_at DESC);

CREATE OR REPLACE VIEW latest_topology AS
    SELECT DISTINCT ON (node_id) * FROM topology_snapshots ORDER BY node_id, received_at DESC, observed_at DESC;
