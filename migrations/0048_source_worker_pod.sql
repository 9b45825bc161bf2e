-- The pod a source worker's process works for, as its own node's agent named it when the worker
-- announced itself (railguard_schema::WorkloadPod). NULL outside a pod and for announcements
-- stored before agents sent it. A name for the source end: no verdict reads it.
ALTER TABLE source_workers ADD COLUMN pod jsonb;
