-- Past one Postgres (#15 item 6), the topology tables too: keyed node first like every other
-- history table (0013), so a distributed Postgres can shard them on node_id with the rest and
-- join a snapshot to its GPUs, NICs and paths on one shard. The children carry their snapshot's
-- node, and a snapshot's record id is unique within its node (a resend is a duplicate; the same
-- id from another node is that node's own snapshot). Not time-partitioned: one snapshot per
-- change per node, and a node's latest snapshot is kept whatever its age (the assessment's
-- structural risk and workload NIC come from it), so no retention drops them by day.
ALTER TABLE topology_gpus ADD COLUMN node_id text;
ALTER TABLE topology_nics ADD COLUMN node_id text;
ALTER TABLE topology_paths ADD COLUMN node_id text;
UPDATE topology_gpus c SET node_id = s.node_id FROM topology_snapshots s WHERE s.record_id = c.snapshot_id;
UPDATE topology_nics c SET node_id = s.node_id FROM topology_snapshots s WHERE s.record_id = c.snapshot_id;
UPDATE topology_paths c SET node_id = s.node_id FROM topology_snapshots s WHERE s.record_id = c.snapshot_id;
ALTER TABLE topology_gpus ALTER COLUMN node_id SET NOT NULL;
ALTER TABLE topology_nics ALTER COLUMN node_id SET NOT NULL;
ALTER TABLE topology_paths ALTER COLUMN node_id SET NOT NULL;

ALTER TABLE topology_gpus DROP CONSTRAINT topology_gpus_snapshot_id_fkey;
ALTER TABLE topology_nics DROP CONSTRAINT topology_nics_snapshot_id_fkey;
ALTER TABLE topology_paths DROP CONSTRAINT topology_paths_snapshot_id_fkey;
ALTER TABLE topology_gpus DROP CONSTRAINT topology_gpus_pkey;
ALTER TABLE topology_nics DROP CONSTRAINT topology_nics_pkey;
ALTER TABLE topology_paths DROP CONSTRAINT topology_paths_pkey;
ALTER TABLE topology_snapshots DROP CONSTRAINT topology_snapshots_pkey;

ALTER TABLE topology_snapshots ADD PRIMARY KEY (node_id, record_id);
ALTER TABLE topology_gpus ADD PRIMARY KEY (node_id, snapshot_id, gpu_index);
ALTER TABLE topology_nics ADD PRIMARY KEY (node_id, snapshot_id, name);
ALTER TABLE topology_paths ADD PRIMARY KEY (node_id, snapshot_id, a, b);
ALTER TABLE topology_gpus ADD FOREIGN KEY (node_id, snapshot_id)
    REFERENCES topology_snapshots (node_id, record_id) ON DELETE CASCADE;
ALTER TABLE topology_nics ADD FOREIGN KEY (node_id, snapshot_id)
    REFERENCES topology_snapshots (node_id, record_id) ON DELETE CASCADE;
ALTER TABLE topology_paths ADD FOREIGN KEY (node_id, snapshot_id)
    REFERENCES topology_snapshots (node_id, record_id) ON DELETE CASCADE;
