-- The fleet summary lists the fleet's status changes of the last hour, newest first, and export
-- reads changes by time: with only the per-GPU index (node, GPU, time) both read every change of
-- the fleet (80,000 rows right after 10,000 nodes were first assessed) to keep a few.
CREATE INDEX gpu_status_changes_time ON gpu_status_changes (at DESC);
