-- A real NIC may move a simulated device's memory (host memory standing in for the GPU's) by
-- DMA: such a report's path is `nic_dma`, and it stays marked simulated, so it is counted as no
-- GPU's proof. The simulated fabric still stands in for simulated devices only.
ALTER TABLE inline_reports DROP CONSTRAINT inline_reports_simulated_path;
