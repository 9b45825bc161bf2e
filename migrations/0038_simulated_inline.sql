-- An in-line report from a simulated device (the demo, the tests) is marked: nothing in it
-- happened on hardware. Its path is `simulated` where the simulated fabric stood in for the NIC's
-- DMA, else `host_copy`; never `nic_dma`.
ALTER TABLE inline_reports ADD COLUMN simulated boolean NOT NULL DEFAULT false;
ALTER TABLE inline_reports DROP CONSTRAINT inline_reports_path_check,
    ADD CONSTRAINT inline_reports_path_check CHECK (path IN ('nic_dma', 'host_copy', 'simulated')),
    ADD CONSTRAINT inline_reports_simulated_path CHECK (NOT simulated OR path <> 'nic_dma'),
    ADD CONSTRAINT inline_reports_simulated_fabric CHECK (path <> 'simulated' OR simulated);
