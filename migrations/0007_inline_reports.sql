-- In-line verification (#17): batches of the workload's own NIXL transfers, checked block by
-- block by railguard's NIXL library and attributed by the node's agent. Hot history,
-- partitioned by UTC day like probe_results.
CREATE TABLE inline_reports (
    record_id           uuid        NOT NULL,
    node_id             text        NOT NULL,
    observed_at         timestamptz NOT NULL,
    received_at         timestamptz NOT NULL DEFAULT now(),
    gpu_index           integer,
    gpu_bdf             text,
    nic                 text        NOT NULL,
    nic_bdf             text,
    pid                 bigint      NOT NULL,
    process             text        NOT NULL,
    memory              text        NOT NULL CHECK (memory IN ('host', 'cuda', 'cuda_staged')),
    path                text        NOT NULL CHECK (path IN ('nic_dma', 'host_copy')),
    attribution         text        NOT NULL,
    transfers_ok        bigint      NOT NULL,
    transfers_mismatch  bigint      NOT NULL,
    transfers_error     bigint      NOT NULL,
    bytes_verified      bigint      NOT NULL,
    blocks_verified     bigint      NOT NULL,
    first_at            timestamptz NOT NULL,
    last_at             timestamptz NOT NULL,
    failures            jsonb       NOT NULL,
    failures_omitted    bigint      NOT NULL,
    PRIMARY KEY (record_id, observed_at)
) PARTITION BY RANGE (observed_at);
CREATE INDEX inline_reports_gpu_time ON inline_reports (node_id, gpu_index, observed_at DESC);
