-- One storage format for the agents' summaries and the pair-hour rollups: the single summaries
-- (agents from before summary sets) become summary sets of one summary each, the per-pair
-- rollups (rolled before node-hour sets) become node-hour sets, and the old tables and their
-- branches of the views are dropped. Ingest refuses single summaries from here on.

-- Every day a single summary is dated on gets its summary-set partition first.
SELECT railguard_ensure_partition('probe_summary_sets'::regclass, d, 'day')
FROM (SELECT DISTINCT (observed_at AT TIME ZONE 'UTC')::date AS d FROM probe_summaries) days;

-- A single summary is dated by its last probe: its set's last probe is that one.
INSERT INTO probe_summary_sets (node_id, observed_at, record_id, first_at, first_before_us, last_before_us,
                                gpu_index, nic, transport, memory, path, injected, simulated, selection, lanes,
                                probes, bytes, duration_min_ns, duration_median_ns, duration_max_ns, gpu_bdf,
                                nic_bdf)
SELECT node_id, observed_at, record_id, first_at,
       ARRAY[least(greatest(extract(epoch FROM observed_at - first_at) * 1e6, 0), 2147483647)::int], ARRAY[0],
       ARRAY[gpu_index], ARRAY[nic], ARRAY[transport], ARRAY[memory], ARRAY[path], ARRAY[injected],
       ARRAY[simulated], ARRAY[selection], ARRAY[lanes], ARRAY[probes], ARRAY[bytes], ARRAY[duration_min_ns],
       ARRAY[duration_median_ns], ARRAY[duration_max_ns], ARRAY[gpu_bdf], ARRAY[nic_bdf]
FROM probe_summaries
ON CONFLICT (node_id, observed_at, record_id) DO NOTHING;

SELECT railguard_ensure_partition('probe_rollup_sets'::regclass, d, 'month')
FROM (SELECT DISTINCT (hour AT TIME ZONE 'UTC')::date AS d FROM probe_rollups) months;

-- A node-hour rolled both ways (the hour the sets began) keeps every pair of both.
INSERT INTO probe_rollup_sets AS s (node_id, hour, gpu_index, nic, transport, memory, path, injected, simulated, ok,
                                    silent_corruption, reported_failure, timeout, bytes, first_failure,
                                    last_failure, rolled_at)
SELECT node_id, hour, array_agg(gpu_index ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(nic ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(transport ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(memory ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(path ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(injected ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(simulated ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(ok ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(silent_corruption ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(reported_failure ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(timeout ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(bytes ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(first_failure ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       array_agg(last_failure ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
       max(rolled_at)
FROM probe_rollups
GROUP BY node_id, hour
ON CONFLICT (node_id, hour) DO UPDATE SET
    gpu_index = s.gpu_index || EXCLUDED.gpu_index, nic = s.nic || EXCLUDED.nic,
    transport = s.transport || EXCLUDED.transport, memory = s.memory || EXCLUDED.memory,
    path = s.path || EXCLUDED.path, injected = s.injected || EXCLUDED.injected,
    simulated = s.simulated || EXCLUDED.simulated, ok = s.ok || EXCLUDED.ok,
    silent_corruption = s.silent_corruption || EXCLUDED.silent_corruption,
    reported_failure = s.reported_failure || EXCLUDED.reported_failure, timeout = s.timeout || EXCLUDED.timeout,
    bytes = s.bytes || EXCLUDED.bytes, first_failure = s.first_failure || EXCLUDED.first_failure,
    last_failure = s.last_failure || EXCLUDED.last_failure;

DROP VIEW probe_row_evidence;
DROP VIEW probe_evidence;
DROP VIEW pair_hours;
DROP TABLE probe_summaries;
DROP TABLE probe_rollups;

-- The evidence stored a record a row (full probes), without the summary sets, which a pass reads
-- as rows of arrays.
CREATE VIEW probe_row_evidence AS
    SELECT node_id, observed_at, gpu_index, nic, transport, memory, path, injected, lanes, verdict, diagnosis,
           1 AS probes
    FROM probe_results;

-- Every probe's evidence, each summary of a set as its own row (dated by its set); last_at is the
-- evidence's own last probe.
CREATE VIEW probe_evidence AS
    SELECT node_id, observed_at, observed_at AS first_at, gpu_index, nic, transport, memory, path, injected,
           simulated, selection, lanes, verdict, diagnosis, reported, bytes, bad_chunks, chunks,
           first_bad_offset, receiver_detail, duration_ns, 1 AS probes, false AS summary, observed_at AS last_at
    FROM probe_results
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

-- Every pair-hour, one row each.
CREATE VIEW pair_hours AS
    SELECT s.node_id, s.hour, m.gpu_index, m.nic, m.transport, m.memory, m.path, m.injected, m.simulated, m.ok,
           m.silent_corruption, m.reported_failure, m.timeout, m.bytes, m.first_failure, m.last_failure
    FROM probe_rollup_sets s
    CROSS JOIN LATERAL unnest(s.gpu_index, s.nic, s.transport, s.memory, s.path, s.injected, s.simulated, s.ok,
                              s.silent_corruption, s.reported_failure, s.timeout, s.bytes, s.first_failure,
                              s.last_failure)
        AS m(gpu_index, nic, transport, memory, path, injected, simulated, ok, silent_corruption, reported_failure,
             timeout, bytes, first_failure, last_failure);
