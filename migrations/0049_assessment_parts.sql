-- The assessment is split by node across the collectors that share this database: every node
-- belongs to one of 64 parts by a hash of its id (stable across Postgres versions: hash
-- partitioning relies on the same function), and each part is assessed by the one collector
-- holding its advisory lock. A stored generated column, so every statement that chooses a
-- part's nodes reads the same part without computing it.
ALTER TABLE nodes ADD COLUMN assess_part smallint NOT NULL
    GENERATED ALWAYS AS ((hashtextextended(node_id, 0) & 63)::smallint) STORED;

-- Each part's last pass: where the collector that takes a part over goes on from. The fleet's
-- last pass of any part stays in assessment_runs.
CREATE TABLE assessment_parts (
    part smallint PRIMARY KEY CHECK (part >= 0 AND part < 64),
    finished_at timestamptz NOT NULL,
    holder text NOT NULL
);
