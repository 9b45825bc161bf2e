-- The pod an in-line report's process works for, as its agent named it (railguard_schema::
-- WorkloadPod: namespace, name, container from the kubelet; uid, container_id from a control
-- group; source). NULL outside a pod and for reports stored before agents sent it. A name for
-- the evidence: no verdict reads it.
ALTER TABLE inline_reports ADD COLUMN pod jsonb;
