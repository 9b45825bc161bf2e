-- Pair-hour rollups as one row per node and hour (#15, storage): what every GPU/NIC pair's probes
-- said in the hour, per provenance, each column an array with one element per pair and
-- provenance (as `probe_summary_sets` does for summaries). A row per pair-hour cost 253 bytes with
-- its 9-column key, 64 pairs × 24 hours = 0.39 MB per node-day kept a year; a node-hour row holds
-- the same counts in about 2.1 kB with its index and TOAST, 0.05 MB per node-day (measured by
-- fleetgen, docs/scaling.md). The leader writes only this table from now on; `probe_rollups`
-- keeps what was rolled before (until its retention), and `pair_hours` reads both.
--
-- A node-hour row exists once the hour was rolled for the node (a GPU without probes in it has no
-- elements): the newest rolled hour of a GPU is its node's. Partitioned by UTC month, keyed node
-- first, retention `--rollup-retention-days`.
CREATE TABLE probe_rollup_sets (
    node_id            text          NOT NULL,
    hour               timestamptz   NOT NULL,
    gpu_index          integer[]     NOT NULL,
    nic                text[]        NOT NULL,
    transport          text[]        NOT NULL,
    memory             text[]        NOT NULL,
    path               text[]        NOT NULL,
    injected           text[]        NOT NULL,
    simulated          boolean[]     NOT NULL,
    ok                 bigint[]      NOT NULL,
    silent_corruption  bigint[]      NOT NULL,
    reported_failure   bigint[]      NOT NULL,
    timeout            bigint[]      NOT NULL,
    bytes              bigint[]      NOT NULL,
    first_failure      timestamptz[] NOT NULL,
    last_failure       timestamptz[] NOT NULL,
    rolled_at          timestamptz   NOT NULL DEFAULT now(),
    CHECK (cardinality(nic) = cardinality(gpu_index) AND cardinality(transport) = cardinality(gpu_index)
           AND cardinality(memory) = cardinality(gpu_index) AND cardinality(path) = cardinality(gpu_index)
           AND cardinality(injected) = cardinality(gpu_index) AND cardinality(simulated) = cardinality(gpu_index)
           AND cardinality(ok) = cardinality(gpu_index)
           AND cardinality(silent_corruption) = cardinality(gpu_index)
           AND cardinality(reported_failure) = cardinality(gpu_index)
           AND cardinality(timeout) = cardinality(gpu_index) AND cardinality(bytes) = cardinality(gpu_index)
           AND cardinality(first_failure) = cardinality(gpu_index)
           AND cardinality(last_failure) = cardinality(gpu_index)),
    PRIMARY KEY (node_id, hour)
) PARTITION BY RANGE (hour);

-- Every pair-hour, from either table, one row each.
CREATE VIEW pair_hours AS
    SELECT node_id, hour, gpu_index, nic, transport, memory, path, injected, simulated, ok, silent_corruption,
           reported_failure, timeout, bytes, first_failure, last_failure
    FROM probe_rollups
    UNION ALL
    SELECT s.node_id, s.hour, m.gpu_index, m.nic, m.transport, m.memory, m.path, m.injected, m.simulated, m.ok,
           m.silent_corruption, m.reported_failure, m.timeout, m.bytes, m.first_failure, m.last_failure
    FROM probe_rollup_sets s
    CROSS JOIN LATERAL unnest(s.gpu_index, s.nic, s.transport, s.memory, s.path, s.injected, s.simulated, s.ok,
                              s.silent_corruption, s.reported_failure, s.timeout, s.bytes, s.first_failure,
                              s.last_failure)
        AS m(gpu_index, nic, transport, memory, path, injected, simulated, ok, silent_corruption, reported_failure,
             timeout, bytes, first_failure, last_failure);
