-- Every finding names the layer its evidence implicates (fabric, nic, gpu, host, engine, remote,
-- undetermined): a GPU's status and pin rest only on the hardware layers of its own path, and
-- the layer its status rests on is kept beside it, with every finding and its layer.
ALTER TABLE gpu_status ADD COLUMN layer text
    CHECK (layer IN ('fabric', 'nic', 'gpu', 'host', 'engine', 'remote', 'undetermined'));
ALTER TABLE gpu_status ADD COLUMN findings jsonb NOT NULL DEFAULT '[]';

-- The serving engine that made each in-line report (name, version, connector, the settings that
-- change which bytes land where), as its connector names itself: engine findings are keyed by it
-- across the fleet. NULL: a library that did not say.
ALTER TABLE inline_reports ADD COLUMN engine jsonb;

-- A GPU with no RDMA NIC in use has nothing for a probe to prove: a state of its own, never `ok`.
ALTER TYPE gpu_verification ADD VALUE IF NOT EXISTS 'no_rdma' BEFORE 'unprobed';
