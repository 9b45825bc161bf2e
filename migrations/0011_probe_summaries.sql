-- Evidence compaction at the edge (#15): the ok probes of one GPU/NIC pair over a window, as the
-- node's agent summarised them (failed probes still arrive in full, in probe_results). Every
-- summary keeps the provenance its probes shared (transport, memory, path, injected fault,
-- simulation, selection, lanes). Partitioned by UTC day on the last summarised probe, keyed node
-- first so a distributed Postgres can shard on node_id; a BRIN index on time serves the fleet's
-- window reads at a few bytes per thousand rows.
CREATE TABLE probe_summaries (
    node_id             text        NOT NULL,
    observed_at         timestamptz NOT NULL,
    record_id           uuid        NOT NULL,
    first_at            timestamptz NOT NULL,
    gpu_index           integer     NOT NULL,
    nic                 text        NOT NULL,
    transport           text        NOT NULL,
    memory              text        NOT NULL CHECK (memory IN ('host', 'cuda', 'cuda_staged')),
    path                text        NOT NULL CHECK (path IN ('nic_dma', 'host_copy', 'simulated')),
    injected            text        NOT NULL,
    simulated           boolean     NOT NULL,
    selection           text        NOT NULL,
    lanes               jsonb       NOT NULL,
    probes              integer     NOT NULL CHECK (probes > 0),
    bytes               bigint      NOT NULL,
    duration_min_ns     bigint      NOT NULL,
    duration_median_ns  bigint      NOT NULL,
    duration_max_ns     bigint      NOT NULL,
    gpu_bdf             text,
    nic_bdf             text,
    PRIMARY KEY (node_id, observed_at, record_id)
) PARTITION BY RANGE (observed_at);
CREATE INDEX probe_summaries_time ON probe_summaries USING brin (observed_at);

-- Every probe's evidence, full or summarised: one row per stored record, `probes` the number of
-- probes it stands for. Readers count with sum(probes), never count(*). A summary is ok by
-- construction (failures are never summarised) and sits at the time of its last probe.
CREATE VIEW probe_evidence AS
    SELECT node_id, observed_at, observed_at AS first_at, gpu_index, nic, transport, memory, path, injected,
           simulated, selection, lanes, verdict, diagnosis, reported, bytes, bad_chunks, chunks,
           first_bad_offset, receiver_detail, duration_ns, 1 AS probes, false AS summary
    FROM probe_results
    UNION ALL
    SELECT node_id, observed_at, first_at, gpu_index, nic, transport, memory, path, injected,
           simulated, selection, lanes, 'ok', 'none', 'success', bytes, 0, 0,
           NULL::bigint, '', duration_median_ns, probes, true
    FROM probe_summaries;
