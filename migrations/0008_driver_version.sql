-- The NVIDIA driver version each node reports (fleet patterns: a failure shared by one driver).
ALTER TABLE topology_snapshots ADD COLUMN driver_version text NOT NULL DEFAULT '';
