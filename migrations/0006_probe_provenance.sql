-- Provenance of every probe: what actually carried its bytes, whether a fault was injected into
-- a real transport (self-test history, never evidence), and the transport's own lanes.
ALTER TABLE probe_results
    ADD COLUMN path text NOT NULL DEFAULT 'host_copy' CHECK (path IN ('nic_dma', 'host_copy', 'simulated')),
    ADD COLUMN injected text NOT NULL DEFAULT 'none',
    ADD COLUMN lanes jsonb NOT NULL DEFAULT '[]';

-- Rows from before the columns, derived as the wire derives them for older agents: the
-- simulated fabric is simulated, verbs moved the bytes by the NIC's DMA, anything else is not
-- known to have used the NIC. The simulated fabric's buffers were host memory.
UPDATE probe_results SET path = CASE
    WHEN simulated THEN 'simulated'
    WHEN transport = 'verbs' THEN 'nic_dma'
    ELSE 'host_copy' END;
UPDATE probe_results SET memory = 'host' WHERE simulated;

-- GPU memory copied through the host by the transport is its own kind of memory use.
ALTER TABLE probe_results DROP CONSTRAINT probe_results_memory_check;
ALTER TABLE probe_results ADD CONSTRAINT probe_results_memory_check
    CHECK (memory IN ('host', 'cuda', 'cuda_staged'));

-- How a GPU's workload pair was verified, by the strongest evidence in the window.
CREATE TYPE gpu_verification AS ENUM ('unprobed', 'unproven', 'simulated', 'host_memory', 'gpu_memory');
ALTER TABLE gpu_status ADD COLUMN verification gpu_verification NOT NULL DEFAULT 'unprobed';
