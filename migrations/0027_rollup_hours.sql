-- The hours the collector has rolled up (#15, storage tiers): one row an hour, written with the
-- hour's rollups (`Store::roll_up_hour`), so a read across the tiers knows which hours of a
-- period the rollups answer without scanning them (the fleet's pattern finder over a day or a
-- month: rolled hours from the rollups, the rest from the evidence). An hour in which no node
-- had evidence is rolled too (no rollup rows: nothing to read, from either tier). Retention
-- forgets the hours of the rollup partitions it drops.
CREATE TABLE rollup_hours (
    hour       timestamptz PRIMARY KEY,
    rolled_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO rollup_hours (hour)
    SELECT hour FROM probe_rollup_sets UNION SELECT hour FROM probe_rollups
    ON CONFLICT DO NOTHING;

-- A period's node-hour rows of the whole fleet by hour (the rows of an hour are written together,
-- so block ranges follow the hour); the per-GPU reads keep the primary key (node, hour).
CREATE INDEX probe_rollup_sets_hour ON probe_rollup_sets USING brin (hour);
