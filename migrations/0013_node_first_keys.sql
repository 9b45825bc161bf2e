-- Past one Postgres (#15 item 6): every time-partitioned history table keyed node first, so a
-- distributed Postgres (Citus) can shard it on node_id (a distributed table's unique keys must
-- contain its distribution column; docs/scaling.md). Idempotency becomes per node: a record id is
-- unique within its node's history. Ids are random UUIDs chosen by each agent and a node writes
-- only as itself, so one node can no longer make another node's record look like a duplicate.
-- (probe_summaries and probe_rollups were created node first.)
ALTER TABLE probe_results DROP CONSTRAINT probe_results_pkey;
ALTER TABLE probe_results ADD PRIMARY KEY (node_id, observed_at, record_id);
ALTER TABLE signal_events DROP CONSTRAINT signal_events_pkey;
ALTER TABLE signal_events ADD PRIMARY KEY (node_id, observed_at, record_id);
ALTER TABLE inline_reports DROP CONSTRAINT inline_reports_pkey;
ALTER TABLE inline_reports ADD PRIMARY KEY (node_id, observed_at, record_id);
-- Status changes are few (one row per change) and not partitioned; their key is node first too.
ALTER TABLE gpu_status_changes DROP CONSTRAINT gpu_status_changes_pkey;
ALTER TABLE gpu_status_changes ADD PRIMARY KEY (node_id, id);
