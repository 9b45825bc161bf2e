-- The NIC to pin a GPU's process to, as a value: its name (one of the node's own NICs, checked
-- by the assessment) and what its good verdicts were proven in. /metrics and the API read these;
-- `recommendation` keeps the sentence shown to people. Rows written before are filled at the
-- next pass that assesses their GPU.
ALTER TABLE gpu_status ADD COLUMN pin_nic text, ADD COLUMN pin_evidence text
    CHECK (pin_evidence IN ('gpu_memory', 'host_memory', 'simulated', 'unprobed'));
