-- How often each node's agent sends a batch: the largest gap between its recent batches (each
-- new gap replaces it when larger; otherwise it decays by a tenth a batch), at most 30 minutes
-- (the longest summary period an agent accepts). An agent that summarises ok probes over 5
-- minutes and has nothing else to send is silent for ~300 s between batches by design; the
-- silent-agent alert compares a node's silence with this, not with a fixed 300 s.
ALTER TABLE nodes ADD COLUMN batch_interval_seconds double precision;
