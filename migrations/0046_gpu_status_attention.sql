-- The GPUs in trouble (not `ok`, or not proven): every alert's subject, and what /metrics lists
-- one by one past --metrics-gpu-series-limit. Read through this index, the page costs what the
-- fleet's trouble costs, not a scan of every GPU's status. The store's statements repeat the
-- predicate word for word, so the planner can use it.
CREATE INDEX gpu_status_attention ON gpu_status (node_id, gpu_index) INCLUDE (status) WHERE status <> 'ok' OR NOT proven;
