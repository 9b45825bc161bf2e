-- Summary sets (#15, storage): the summaries an agent closed together (its pairs' windows end at
-- the same boundaries) in one row per node and window, each column an array with one element per
-- summary. A row per pair cost 259 bytes with its index, 64 pairs × 288 windows a day = 4.2 MB per
-- node-day; a set of 64 is about 2.1 kB with its index and TOAST once Postgres compresses its
-- arrays, 0.61 MB per node-day (measured by fleetgen, docs/scaling.md).
--
-- `observed_at` is the set's last probe and dates every summary in it (so a window read is an
-- index range on the set, not on its elements); each summary's own first and last probe are kept
-- as microseconds before it (`first_before_us`, `last_before_us`; a set spans at most 30 minutes,
-- which the collector checks). GPU and NIC BDFs are NULL elements where the agent had none.
-- Summaries from agents before sets (one record a pair) still go to `probe_summaries`' rows.
-- Partitioned by UTC day, node first, with the summaries' retention (`--summary-retention-days`).
CREATE TABLE probe_summary_sets (
    node_id             text          NOT NULL,
    observed_at         timestamptz   NOT NULL,
    record_id           uuid          NOT NULL,
    first_at            timestamptz   NOT NULL,
    gpu_index           integer[]     NOT NULL,
    nic                 text[]        NOT NULL,
    transport           text[]        NOT NULL,
    memory              text[]        NOT NULL CHECK (memory <@ ARRAY['host', 'cuda', 'cuda_staged']),
    path                text[]        NOT NULL CHECK (path <@ ARRAY['nic_dma', 'host_copy', 'simulated']),
    injected            text[]        NOT NULL,
    simulated           boolean[]     NOT NULL,
    selection           text[]        NOT NULL,
    lanes               jsonb[]       NOT NULL,
    probes              integer[]     NOT NULL,
    bytes               bigint[]      NOT NULL,
    duration_min_ns     bigint[]      NOT NULL,
    duration_median_ns  bigint[]      NOT NULL,
    duration_max_ns     bigint[]      NOT NULL,
    first_before_us     integer[]     NOT NULL,
    last_before_us      integer[]     NOT NULL,
    gpu_bdf             text[]        NOT NULL,
    nic_bdf             text[]        NOT NULL,
    CHECK (cardinality(gpu_index) BETWEEN 1 AND 1024),
    CHECK (cardinality(nic) = cardinality(gpu_index) AND cardinality(transport) = cardinality(gpu_index)
           AND cardinality(memory) = cardinality(gpu_index) AND cardinality(path) = cardinality(gpu_index)
           AND cardinality(injected) = cardinality(gpu_index) AND cardinality(simulated) = cardinality(gpu_index)
           AND cardinality(selection) = cardinality(gpu_index) AND cardinality(lanes) = cardinality(gpu_index)
           AND cardinality(probes) = cardinality(gpu_index) AND cardinality(bytes) = cardinality(gpu_index)
           AND cardinality(duration_min_ns) = cardinality(gpu_index)
           AND cardinality(duration_median_ns) = cardinality(gpu_index)
           AND cardinality(duration_max_ns) = cardinality(gpu_index)
           AND cardinality(first_before_us) = cardinality(gpu_index)
           AND cardinality(last_before_us) = cardinality(gpu_index)
           AND cardinality(gpu_bdf) = cardinality(gpu_index) AND cardinality(nic_bdf) = cardinality(gpu_index)),
    PRIMARY KEY (node_id, observed_at, record_id)
) PARTITION BY RANGE (observed_at);
CREATE INDEX probe_summary_sets_time ON probe_summary_sets USING brin (observed_at);

-- Every probe's evidence, now with each summary of a set as its own row (dated by its set), and a
-- new last column: the evidence's own last probe (a probe's or a single summary's observed_at; a
-- set's summary's own last probe, at most one window before the set's date).
CREATE OR REPLACE VIEW probe_evidence AS
    SELECT node_id, observed_at, observed_at AS first_at, gpu_index, nic, transport, memory, path, injected,
           simulated, selection, lanes, verdict, diagnosis, reported, bytes, bad_chunks, chunks,
           first_bad_offset, receiver_detail, duration_ns, 1 AS probes, false AS summary, observed_at AS last_at
    FROM probe_results
    UNION ALL
    SELECT node_id, observed_at, first_at, gpu_index, nic, transport, memory, path, injected,
           simulated, selection, lanes, 'ok', 'none', 'success', bytes, 0, 0,
           NULL::bigint, '', duration_median_ns, probes, true, observed_at
    FROM probe_summaries
    UNION ALL
    SELECT s.node_id, s.observed_at, s.observed_at - m.first_before_us * interval '1 microsecond', m.gpu_index,
           m.nic, m.transport, m.memory, m.path, m.injected, m.simulated, m.selection, m.lanes, 'ok', 'none',
           'success', m.bytes, 0, 0, NULL::bigint, '', m.duration_median_ns, m.probes, true,
           s.observed_at - m.last_before_us * interval '1 microsecond'
    FROM probe_summary_sets s
    CROSS JOIN LATERAL unnest(s.gpu_index, s.nic, s.transport, s.memory, s.path, s.injected, s.simulated,
                              s.selection, s.lanes, s.probes, s.bytes, s.duration_median_ns, s.first_before_us,
                              s.last_before_us)
        AS m(gpu_index, nic, transport, memory, path, injected, simulated, selection, lanes, probes, bytes,
             duration_median_ns, first_before_us, last_before_us);
