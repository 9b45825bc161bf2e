-- What each node's agent says it is doing, as its latest batch (its heartbeat included) said it:
-- probing, nothing to probe, passive (probes off) or degraded, with its own words. Null: an agent
-- older than the field, or one that has not sent a batch since.
ALTER TABLE nodes
    ADD COLUMN agent_activity text CHECK (agent_activity IN ('probing', 'nothing_to_probe', 'passive', 'degraded')),
    ADD COLUMN agent_detail text NOT NULL DEFAULT '',
    ADD COLUMN agent_state_at timestamptz;
