-- Reads shared by several queries.
--
-- Each node's latest topology snapshot, one row a node: the assessment, the fleet grid and the
-- pattern finder all read it (each spelled the same DISTINCT ON before). A filter on node_id is
-- pushed into the view (it names only the DISTINCT ON column), so a read of a few nodes stays
-- an index scan of `topology_snapshots_node_time`.
CREATE VIEW latest_topology AS
    SELECT DISTINCT ON (node_id) * FROM topology_snapshots ORDER BY node_id, observed_at DESC;

-- The trust rule, once (the assessment and the pattern finder apply it): a probe is evidence
-- about its pair when the pair's NIC moved its bytes (`nic_dma`), or when it ran on the simulated
-- fabric of a node whose evidence in the window is all simulated (a simulated node stands in for
-- hardware, marked as such); a host copy, or a simulated probe mixed into a node with hardware
-- evidence, proves nothing about the pair. Inlined by the planner (SQL, immutable).
CREATE FUNCTION railguard_trusted(path text, node_all_simulated boolean) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$ SELECT path = 'nic_dma' OR (path = 'simulated' AND node_all_simulated) $$;
