-- The schema the migrations in migrations/ produce, read from Postgres's catalogs after they
-- all ran. Generated: do not edit. After adding a migration, regenerate it with
--   RAILGUARD_BLESS=1 cargo nextest run -p railguard-e2e --test schema_snapshot
-- Partitions created by date, and the migration bookkeeping table, are left out.

CREATE TYPE gpu_status_kind AS ENUM ('ok', 'watch', 'unknown', 'at_risk', 'corrupting');

CREATE TYPE gpu_verification AS ENUM ('no_rdma', 'unprobed', 'unproven', 'simulated', 'host_memory', 'gpu_memory');

CREATE TABLE assessment_parts (
    part smallint NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    holder text NOT NULL
);

CREATE TABLE assessment_runs (
    id integer NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    holder text NOT NULL
);

CREATE TABLE gpu_status (
    node_id text NOT NULL,
    gpu_index integer NOT NULL,
    status gpu_status_kind NOT NULL,
    since timestamp with time zone NOT NULL,
    assessed_at timestamp with time zone NOT NULL,
    workload_nic text,
    structural_risk text,
    reasons jsonb NOT NULL,
    recommendation text,
    verification gpu_verification NOT NULL DEFAULT 'unprobed'::gpu_verification,
    pin_nic text,
    pin_evidence text,
    evidence_path text,
    proven boolean NOT NULL DEFAULT false,
    pin_verified boolean NOT NULL DEFAULT false,
    layer text,
    findings jsonb NOT NULL DEFAULT '[]'::jsonb
);

CREATE TABLE gpu_status_changes (
    id bigint NOT NULL DEFAULT nextval('gpu_status_changes_id_seq'::regclass),
    node_id text NOT NULL,
    gpu_index integer NOT NULL,
    at timestamp with time zone NOT NULL,
    from_status gpu_status_kind,
    to_status gpu_status_kind NOT NULL,
    reasons jsonb NOT NULL
);

CREATE TABLE inline_reports (
    record_id uuid NOT NULL,
    node_id text NOT NULL,
    observed_at timestamp with time zone NOT NULL,
    received_at timestamp with time zone NOT NULL DEFAULT now(),
    gpu_index integer,
    gpu_bdf text,
    nic text NOT NULL,
    nic_bdf text,
    pid bigint NOT NULL,
    process text NOT NULL,
    memory text NOT NULL,
    path text NOT NULL,
    attribution text NOT NULL,
    transfers_ok bigint NOT NULL,
    transfers_mismatch bigint NOT NULL,
    transfers_error bigint NOT NULL,
    bytes_verified bigint NOT NULL,
    blocks_verified bigint NOT NULL,
    first_at timestamp with time zone NOT NULL,
    last_at timestamp with time zone NOT NULL,
    failures jsonb NOT NULL,
    failures_omitted bigint NOT NULL,
    engine jsonb,
    transfers_mismatch_misplaced bigint NOT NULL DEFAULT 0,
    simulated boolean NOT NULL DEFAULT false,
    sources_changed bigint NOT NULL DEFAULT 0,
    pod jsonb
) PARTITION BY RANGE (observed_at);

CREATE TABLE node_status (
    node_id text NOT NULL,
    gpus bigint NOT NULL DEFAULT 0,
    ok bigint NOT NULL DEFAULT 0,
    watch bigint NOT NULL DEFAULT 0,
    at_risk bigint NOT NULL DEFAULT 0,
    corrupting bigint NOT NULL DEFAULT 0,
    unverified bigint NOT NULL DEFAULT 0,
    worst gpu_status_kind,
    rank integer NOT NULL DEFAULT 0,
    unknown bigint NOT NULL DEFAULT 0
);

CREATE TABLE nodes (
    node_id text NOT NULL,
    hostname text NOT NULL DEFAULT ''::text,
    agent_version text NOT NULL DEFAULT ''::text,
    first_seen timestamp with time zone NOT NULL DEFAULT now(),
    last_seen timestamp with time zone NOT NULL DEFAULT now(),
    spool_dropped_total bigint NOT NULL DEFAULT 0,
    evidence_pending boolean NOT NULL DEFAULT true,
    assessed_at timestamp with time zone,
    late_stored_at timestamp with time zone,
    batch_interval_seconds double precision,
    agent_activity text,
    agent_detail text NOT NULL DEFAULT ''::text,
    agent_state_at timestamp with time zone,
    assess_part smallint NOT NULL GENERATED ALWAYS AS (((hashtextextended(node_id, (0)::bigint) & (63)::bigint))::smallint) STORED,
    newest_evidence_at timestamp with time zone
);

CREATE TABLE probe_results (
    record_id uuid NOT NULL,
    node_id text NOT NULL,
    observed_at timestamp with time zone NOT NULL,
    received_at timestamp with time zone NOT NULL DEFAULT now(),
    gpu_index integer NOT NULL,
    gpu_bdf text,
    nic text NOT NULL,
    nic_bdf text,
    transport text NOT NULL,
    bytes bigint NOT NULL,
    reported text NOT NULL,
    reported_detail text NOT NULL,
    verdict text NOT NULL,
    diagnosis text NOT NULL,
    first_bad_offset bigint,
    bad_chunks integer NOT NULL,
    chunks integer NOT NULL,
    duration_ns bigint NOT NULL,
    selection text NOT NULL,
    simulated boolean NOT NULL,
    bit_flips bigint NOT NULL DEFAULT 0,
    receiver_detail text NOT NULL DEFAULT ''::text,
    memory text NOT NULL DEFAULT 'host'::text,
    path text NOT NULL DEFAULT 'host_copy'::text,
    injected text NOT NULL DEFAULT 'none'::text,
    lanes jsonb NOT NULL DEFAULT '[]'::jsonb
) PARTITION BY RANGE (observed_at);

CREATE TABLE probe_rollup_sets (
    node_id text NOT NULL,
    hour timestamp with time zone NOT NULL,
    gpu_index integer[] NOT NULL,
    nic text[] NOT NULL,
    transport text[] NOT NULL,
    memory text[] NOT NULL,
    path text[] NOT NULL,
    injected text[] NOT NULL,
    simulated boolean[] NOT NULL,
    ok bigint[] NOT NULL,
    silent_corruption bigint[] NOT NULL,
    reported_failure bigint[] NOT NULL,
    timeout bigint[] NOT NULL,
    bytes bigint[] NOT NULL,
    first_failure timestamp with time zone[] NOT NULL,
    last_failure timestamp with time zone[] NOT NULL,
    rolled_at timestamp with time zone NOT NULL DEFAULT now()
) PARTITION BY RANGE (hour);

CREATE TABLE probe_rollups_daily (
    node_id text NOT NULL,
    day timestamp with time zone NOT NULL,
    gpu_index integer NOT NULL,
    nic text NOT NULL,
    transport text NOT NULL,
    memory text NOT NULL,
    path text NOT NULL,
    injected text NOT NULL,
    simulated boolean NOT NULL,
    ok bigint NOT NULL,
    silent_corruption bigint NOT NULL,
    reported_failure bigint NOT NULL,
    timeout bigint NOT NULL,
    bytes bigint NOT NULL,
    first_failure timestamp with time zone,
    last_failure timestamp with time zone,
    rolled_at timestamp with time zone NOT NULL DEFAULT now()
) PARTITION BY RANGE (day);

CREATE TABLE probe_summary_sets (
    node_id text NOT NULL,
    observed_at timestamp with time zone NOT NULL,
    record_id uuid NOT NULL,
    first_at timestamp with time zone NOT NULL,
    gpu_index integer[] NOT NULL,
    nic text[] NOT NULL,
    transport text[] NOT NULL,
    memory text[] NOT NULL,
    path text[] NOT NULL,
    injected text[] NOT NULL,
    simulated boolean[] NOT NULL,
    selection text[] NOT NULL,
    lanes jsonb[] NOT NULL,
    probes integer[] NOT NULL,
    bytes bigint[] NOT NULL,
    duration_min_ns bigint[] NOT NULL,
    duration_median_ns bigint[] NOT NULL,
    duration_max_ns bigint[] NOT NULL,
    first_before_us integer[] NOT NULL,
    last_before_us integer[] NOT NULL,
    gpu_bdf text[] NOT NULL,
    nic_bdf text[] NOT NULL
) PARTITION BY RANGE (observed_at);

CREATE TABLE rollup_hours (
    hour timestamp with time zone NOT NULL,
    rolled_at timestamp with time zone NOT NULL DEFAULT now(),
    repeats_merged_at timestamp with time zone
);

CREATE TABLE signal_events (
    record_id uuid NOT NULL,
    node_id text NOT NULL,
    observed_at timestamp with time zone NOT NULL,
    received_at timestamp with time zone NOT NULL DEFAULT now(),
    source text NOT NULL,
    kind text NOT NULL,
    bdf text,
    gpu_index integer,
    nic text NOT NULL,
    summary text NOT NULL,
    attrs jsonb NOT NULL
) PARTITION BY RANGE (observed_at);

CREATE TABLE source_workers (
    worker text NOT NULL,
    node_id text NOT NULL,
    observed_at timestamp with time zone NOT NULL,
    record_id uuid NOT NULL,
    gpu_index integer NOT NULL,
    gpu_bdf text,
    gpu_uuid text NOT NULL DEFAULT ''::text,
    nic text NOT NULL DEFAULT ''::text,
    nic_bdf text,
    pid bigint NOT NULL,
    process text NOT NULL,
    path text NOT NULL,
    attribution text NOT NULL,
    simulated boolean NOT NULL DEFAULT false,
    engine jsonb,
    pod jsonb
);

CREATE TABLE topology_gpus (
    snapshot_id uuid NOT NULL,
    gpu_index integer NOT NULL,
    bdf text NOT NULL,
    numa_node integer NOT NULL,
    name text NOT NULL,
    uuid text NOT NULL,
    node_id text NOT NULL
);

CREATE TABLE topology_nics (
    snapshot_id uuid NOT NULL,
    name text NOT NULL,
    bdf text NOT NULL,
    numa_node integer NOT NULL,
    ports jsonb NOT NULL,
    netdevs text[] NOT NULL,
    node_id text NOT NULL
);

CREATE TABLE topology_paths (
    snapshot_id uuid NOT NULL,
    a text NOT NULL,
    b text NOT NULL,
    class text NOT NULL,
    nvlinks integer NOT NULL,
    node_id text NOT NULL
);

CREATE TABLE topology_snapshots (
    record_id uuid NOT NULL,
    node_id text NOT NULL,
    observed_at timestamp with time zone NOT NULL,
    received_at timestamp with time zone NOT NULL DEFAULT now(),
    virtualized text NOT NULL,
    hypervisor text NOT NULL,
    viommu text NOT NULL,
    gpudirect text NOT NULL,
    kernel_iommu_flags text NOT NULL,
    risks jsonb NOT NULL,
    warnings jsonb NOT NULL,
    driver_version text NOT NULL DEFAULT ''::text,
    gone_gpus jsonb NOT NULL DEFAULT '[]'::jsonb
);

ALTER TABLE assessment_parts ADD CONSTRAINT assessment_parts_part_check CHECK (((part >= 0) AND (part < 64)));
ALTER TABLE assessment_parts ADD CONSTRAINT assessment_parts_pkey PRIMARY KEY (part);
ALTER TABLE assessment_runs ADD CONSTRAINT assessment_runs_id_check CHECK ((id = 1));
ALTER TABLE assessment_runs ADD CONSTRAINT assessment_runs_pkey PRIMARY KEY (id);
ALTER TABLE gpu_status ADD CONSTRAINT gpu_status_evidence_path_check CHECK ((evidence_path = ANY (ARRAY['nic_dma'::text, 'host_copy'::text, 'simulated'::text, 'other_device'::text])));
ALTER TABLE gpu_status ADD CONSTRAINT gpu_status_layer_check CHECK ((layer = ANY (ARRAY['fabric'::text, 'nic'::text, 'gpu'::text, 'host'::text, 'engine'::text, 'remote'::text, 'undetermined'::text])));
ALTER TABLE gpu_status ADD CONSTRAINT gpu_status_pin_evidence_check CHECK ((pin_evidence = ANY (ARRAY['gpu_memory'::text, 'host_memory'::text, 'simulated'::text, 'unprobed'::text])));
ALTER TABLE gpu_status ADD CONSTRAINT gpu_status_pkey PRIMARY KEY (node_id, gpu_index);
ALTER TABLE gpu_status_changes ADD CONSTRAINT gpu_status_changes_pkey PRIMARY KEY (node_id, id);
ALTER TABLE inline_reports ADD CONSTRAINT inline_reports_check CHECK (((transfers_mismatch_misplaced >= 0) AND (transfers_mismatch_misplaced <= transfers_mismatch)));
ALTER TABLE inline_reports ADD CONSTRAINT inline_reports_memory_check CHECK ((memory = ANY (ARRAY['host'::text, 'cuda'::text, 'cuda_staged'::text])));
ALTER TABLE inline_reports ADD CONSTRAINT inline_reports_path_check CHECK ((path = ANY (ARRAY['nic_dma'::text, 'host_copy'::text, 'simulated'::text])));
ALTER TABLE inline_reports ADD CONSTRAINT inline_reports_pkey PRIMARY KEY (node_id, observed_at, record_id);
ALTER TABLE inline_reports ADD CONSTRAINT inline_reports_simulated_fabric CHECK (((path <> 'simulated'::text) OR simulated));
ALTER TABLE inline_reports ADD CONSTRAINT inline_reports_sources_changed_check CHECK ((sources_changed >= 0));
ALTER TABLE node_status ADD CONSTRAINT node_status_node_id_fkey FOREIGN KEY (node_id) REFERENCES nodes(node_id);
ALTER TABLE node_status ADD CONSTRAINT node_status_pkey PRIMARY KEY (node_id);
ALTER TABLE nodes ADD CONSTRAINT nodes_agent_activity_check CHECK ((agent_activity = ANY (ARRAY['probing'::text, 'nothing_to_probe'::text, 'passive'::text, 'degraded'::text])));
ALTER TABLE nodes ADD CONSTRAINT nodes_pkey PRIMARY KEY (node_id);
ALTER TABLE probe_results ADD CONSTRAINT probe_results_memory_check CHECK ((memory = ANY (ARRAY['host'::text, 'cuda'::text, 'cuda_staged'::text])));
ALTER TABLE probe_results ADD CONSTRAINT probe_results_path_check CHECK ((path = ANY (ARRAY['nic_dma'::text, 'host_copy'::text, 'simulated'::text, 'other_device'::text])));
ALTER TABLE probe_results ADD CONSTRAINT probe_results_pkey PRIMARY KEY (node_id, observed_at, record_id);
ALTER TABLE probe_rollup_sets ADD CONSTRAINT probe_rollup_sets_check CHECK (((cardinality(nic) = cardinality(gpu_index)) AND (cardinality(transport) = cardinality(gpu_index)) AND (cardinality(memory) = cardinality(gpu_index)) AND (cardinality(path) = cardinality(gpu_index)) AND (cardinality(injected) = cardinality(gpu_index)) AND (cardinality(simulated) = cardinality(gpu_index)) AND (cardinality(ok) = cardinality(gpu_index)) AND (cardinality(silent_corruption) = cardinality(gpu_index)) AND (cardinality(reported_failure) = cardinality(gpu_index)) AND (cardinality(timeout) = cardinality(gpu_index)) AND (cardinality(bytes) = cardinality(gpu_index)) AND (cardinality(first_failure) = cardinality(gpu_index)) AND (cardinality(last_failure) = cardinality(gpu_index))));
ALTER TABLE probe_rollup_sets ADD CONSTRAINT probe_rollup_sets_pkey PRIMARY KEY (node_id, hour);
ALTER TABLE probe_rollups_daily ADD CONSTRAINT probe_rollups_daily_pkey PRIMARY KEY (node_id, gpu_index, day, nic, transport, memory, path, injected, simulated);
ALTER TABLE probe_summary_sets ADD CONSTRAINT probe_summary_sets_check CHECK (((cardinality(nic) = cardinality(gpu_index)) AND (cardinality(transport) = cardinality(gpu_index)) AND (cardinality(memory) = cardinality(gpu_index)) AND (cardinality(path) = cardinality(gpu_index)) AND (cardinality(injected) = cardinality(gpu_index)) AND (cardinality(simulated) = cardinality(gpu_index)) AND (cardinality(selection) = cardinality(gpu_index)) AND (cardinality(lanes) = cardinality(gpu_index)) AND (cardinality(probes) = cardinality(gpu_index)) AND (cardinality(bytes) = cardinality(gpu_index)) AND (cardinality(duration_min_ns) = cardinality(gpu_index)) AND (cardinality(duration_median_ns) = cardinality(gpu_index)) AND (cardinality(duration_max_ns) = cardinality(gpu_index)) AND (cardinality(first_before_us) = cardinality(gpu_index)) AND (cardinality(last_before_us) = cardinality(gpu_index)) AND (cardinality(gpu_bdf) = cardinality(gpu_index)) AND (cardinality(nic_bdf) = cardinality(gpu_index))));
ALTER TABLE probe_summary_sets ADD CONSTRAINT probe_summary_sets_gpu_index_check CHECK (((cardinality(gpu_index) >= 1) AND (cardinality(gpu_index) <= 1024)));
ALTER TABLE probe_summary_sets ADD CONSTRAINT probe_summary_sets_memory_check CHECK ((memory <@ ARRAY['host'::text, 'cuda'::text, 'cuda_staged'::text]));
ALTER TABLE probe_summary_sets ADD CONSTRAINT probe_summary_sets_path_check CHECK ((path <@ ARRAY['nic_dma'::text, 'host_copy'::text, 'simulated'::text, 'other_device'::text]));
ALTER TABLE probe_summary_sets ADD CONSTRAINT probe_summary_sets_pkey PRIMARY KEY (node_id, observed_at, record_id);
ALTER TABLE rollup_hours ADD CONSTRAINT rollup_hours_pkey PRIMARY KEY (hour);
ALTER TABLE signal_events ADD CONSTRAINT signal_events_pkey PRIMARY KEY (node_id, observed_at, record_id);
ALTER TABLE source_workers ADD CONSTRAINT source_workers_pkey PRIMARY KEY (worker, node_id);
ALTER TABLE topology_gpus ADD CONSTRAINT topology_gpus_node_id_snapshot_id_fkey FOREIGN KEY (node_id, snapshot_id) REFERENCES topology_snapshots(node_id, record_id) ON DELETE CASCADE;
ALTER TABLE topology_gpus ADD CONSTRAINT topology_gpus_pkey PRIMARY KEY (node_id, snapshot_id, gpu_index);
ALTER TABLE topology_nics ADD CONSTRAINT topology_nics_node_id_snapshot_id_fkey FOREIGN KEY (node_id, snapshot_id) REFERENCES topology_snapshots(node_id, record_id) ON DELETE CASCADE;
ALTER TABLE topology_nics ADD CONSTRAINT topology_nics_pkey PRIMARY KEY (node_id, snapshot_id, name);
ALTER TABLE topology_paths ADD CONSTRAINT topology_paths_node_id_snapshot_id_fkey FOREIGN KEY (node_id, snapshot_id) REFERENCES topology_snapshots(node_id, record_id) ON DELETE CASCADE;
ALTER TABLE topology_paths ADD CONSTRAINT topology_paths_pkey PRIMARY KEY (node_id, snapshot_id, a, b);
ALTER TABLE topology_snapshots ADD CONSTRAINT topology_snapshots_node_id_fkey FOREIGN KEY (node_id) REFERENCES nodes(node_id);
ALTER TABLE topology_snapshots ADD CONSTRAINT topology_snapshots_pkey PRIMARY KEY (node_id, record_id);

CREATE INDEX gpu_status_attention ON public.gpu_status USING btree (node_id, gpu_index) INCLUDE (status) WHERE ((status <> 'ok'::gpu_status_kind) OR (NOT proven));
CREATE INDEX gpu_status_by_severity ON public.gpu_status USING btree (status DESC, node_id, gpu_index);
CREATE INDEX gpu_status_changes_gpu_time ON public.gpu_status_changes USING btree (node_id, gpu_index, at DESC);
CREATE INDEX gpu_status_changes_time ON public.gpu_status_changes USING btree (at DESC);
CREATE INDEX inline_reports_gpu_time ON ONLY public.inline_reports USING btree (node_id, gpu_index, observed_at DESC);
CREATE INDEX inline_reports_sources_changed ON ONLY public.inline_reports USING btree (observed_at) WHERE (sources_changed > 0);
CREATE INDEX inline_reports_time ON ONLY public.inline_reports USING brin (observed_at);
CREATE INDEX node_status_rank ON public.node_status USING btree (rank DESC, node_id);
CREATE INDEX probe_results_failed_time ON ONLY public.probe_results USING btree (observed_at) WHERE (verdict <> 'ok'::text);
CREATE INDEX probe_results_gpu_time ON ONLY public.probe_results USING btree (node_id, gpu_index, observed_at DESC);
CREATE INDEX probe_results_time ON ONLY public.probe_results USING brin (observed_at);
CREATE INDEX probe_rollup_sets_hour ON ONLY public.probe_rollup_sets USING brin (hour);
CREATE INDEX probe_summary_sets_time ON ONLY public.probe_summary_sets USING brin (observed_at);
CREATE INDEX signal_events_node_time ON ONLY public.signal_events USING btree (node_id, observed_at DESC);
CREATE INDEX signal_events_time ON ONLY public.signal_events USING brin (observed_at);
CREATE INDEX source_workers_node ON public.source_workers USING btree (node_id, observed_at DESC);
CREATE INDEX topology_snapshots_node_received ON public.topology_snapshots USING btree (node_id, received_at DESC, observed_at DESC);
CREATE INDEX topology_snapshots_node_time ON public.topology_snapshots USING btree (node_id, observed_at DESC);

CREATE VIEW inline_source_changes AS
 SELECT r.node_id,
    r.observed_at,
    r.gpu_index,
    x.value ->> 'remote'::text AS transfer,
    split_part(x.value ->> 'remote'::text, '/'::text, 1) AS worker,
    r.engine
   FROM inline_reports r
     CROSS JOIN LATERAL jsonb_array_elements(r.failures) x(value)
     CROSS JOIN LATERAL railguard_source_end(split_part(x.value ->> 'remote'::text, '/'::text, 1)) e(node_id, gpu_index, gpu_bdf, nic, path, simulated, announced_by)
  WHERE r.sources_changed > 0 AND (x.value ->> 'source_changed'::text) = 'true'::text AND e.announced_by = 1 AND e.node_id = r.node_id AND e.gpu_index = r.gpu_index;

CREATE VIEW inline_source_failures AS
 SELECT r.node_id,
    r.observed_at,
    r.gpu_index,
    r.nic,
    r.path,
    r.simulated,
    (x.value ->> 'at'::text)::timestamp with time zone AS at,
    split_part(x.value ->> 'remote'::text, '/'::text, 1) AS source,
    x.value -> 'source'::text AS claim,
    e.node_id AS end_node,
    e.gpu_index AS end_gpu,
    e.gpu_bdf AS end_gpu_bdf,
    e.nic AS end_nic,
    e.path AS end_path,
    e.simulated AS end_simulated,
    e.announced_by,
        CASE
            WHEN e.announced_by = 1 THEN (((('pair:'::text || e.node_id) || '/'::text) || e.gpu_index) || '/'::text) || e.nic
            ELSE 'name:'::text || split_part(x.value ->> 'remote'::text, '/'::text, 1)
        END AS source_key,
    e.announced_by = 1 AND (EXISTS ( SELECT 1
           FROM gpu_status s
          WHERE s.node_id = e.node_id AND s.gpu_index = e.gpu_index AND s.status = 'ok'::gpu_status_kind AND s.proven AND s.workload_nic = e.nic)) AS end_proven_clean
   FROM inline_reports r
     CROSS JOIN LATERAL jsonb_array_elements(r.failures) x(value)
     CROSS JOIN LATERAL railguard_source_end(split_part(x.value ->> 'remote'::text, '/'::text, 1)) e(node_id, gpu_index, gpu_bdf, nic, path, simulated, announced_by)
  WHERE r.transfers_mismatch > 0 AND r.gpu_index IS NOT NULL AND (x.value ->> 'mismatch'::text) = 'true'::text AND split_part(COALESCE(x.value ->> 'remote'::text, ''::text), '/'::text, 1) <> ''::text AND NOT railguard_failure_misplaced(x.value) AND NOT railguard_changed_at_source(x.value ->> 'remote'::text, r.observed_at);

CREATE VIEW latest_topology AS
 SELECT DISTINCT ON (topology_snapshots.node_id) topology_snapshots.record_id,
    topology_snapshots.node_id,
    topology_snapshots.observed_at,
    topology_snapshots.received_at,
    topology_snapshots.virtualized,
    topology_snapshots.hypervisor,
    topology_snapshots.viommu,
    topology_snapshots.gpudirect,
    topology_snapshots.kernel_iommu_flags,
    topology_snapshots.risks,
    topology_snapshots.warnings,
    topology_snapshots.driver_version,
    topology_snapshots.gone_gpus
   FROM topology_snapshots
  ORDER BY topology_snapshots.node_id, topology_snapshots.received_at DESC, topology_snapshots.observed_at DESC;

CREATE VIEW pair_hours AS
 SELECT s.node_id,
    s.hour,
    m.gpu_index,
    m.nic,
    m.transport,
    m.memory,
    m.path,
    m.injected,
    m.simulated,
    m.ok,
    m.silent_corruption,
    m.reported_failure,
    m.timeout,
    m.bytes,
    m.first_failure,
    m.last_failure
   FROM probe_rollup_sets s
     CROSS JOIN LATERAL UNNEST(s.gpu_index, s.nic, s.transport, s.memory, s.path, s.injected, s.simulated, s.ok, s.silent_corruption, s.reported_failure, s.timeout, s.bytes, s.first_failure, s.last_failure) m(gpu_index, nic, transport, memory, path, injected, simulated, ok, silent_corruption, reported_failure, timeout, bytes, first_failure, last_failure);

CREATE VIEW probe_evidence AS
 SELECT probe_results.node_id,
    probe_results.observed_at,
    probe_results.observed_at AS first_at,
    probe_results.gpu_index,
    probe_results.nic,
    probe_results.transport,
    probe_results.memory,
    probe_results.path,
    probe_results.injected,
    probe_results.simulated,
    probe_results.selection,
    probe_results.lanes,
    probe_results.verdict,
    probe_results.diagnosis,
    probe_results.reported,
    probe_results.bytes,
    probe_results.bad_chunks,
    probe_results.chunks,
    probe_results.first_bad_offset,
    probe_results.receiver_detail,
    probe_results.duration_ns,
    1 AS probes,
    false AS summary,
    probe_results.observed_at AS last_at
   FROM probe_results
UNION ALL
 SELECT s.node_id,
    s.observed_at,
    s.observed_at - m.first_before_us::double precision * '00:00:00.000001'::interval AS first_at,
    m.gpu_index,
    m.nic,
    m.transport,
    m.memory,
    m.path,
    m.injected,
    m.simulated,
    m.selection,
    m.lanes,
    'ok'::text AS verdict,
    'none'::text AS diagnosis,
    'success'::text AS reported,
    m.bytes,
    0 AS bad_chunks,
    0 AS chunks,
    NULL::bigint AS first_bad_offset,
    ''::text AS receiver_detail,
    m.duration_median_ns AS duration_ns,
    m.probes,
    true AS summary,
    s.observed_at - m.last_before_us::double precision * '00:00:00.000001'::interval AS last_at
   FROM probe_summary_sets s
     CROSS JOIN LATERAL UNNEST(s.gpu_index, s.nic, s.transport, s.memory, s.path, s.injected, s.simulated, s.selection, s.lanes, s.probes, s.bytes, s.duration_median_ns, s.first_before_us, s.last_before_us) m(gpu_index, nic, transport, memory, path, injected, simulated, selection, lanes, probes, bytes, duration_median_ns, first_before_us, last_before_us);

CREATE VIEW probe_row_evidence AS
 SELECT probe_results.node_id,
    probe_results.observed_at,
    probe_results.gpu_index,
    probe_results.nic,
    probe_results.transport,
    probe_results.memory,
    probe_results.path,
    probe_results.injected,
    probe_results.lanes,
    probe_results.verdict,
    probe_results.diagnosis,
    1 AS probes
   FROM probe_results;

CREATE OR REPLACE FUNCTION public.railguard_analyze_new_partitions(min_changes bigint)
 RETURNS SETOF text
 LANGUAGE plpgsql
AS $function$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT n.nspname, c.relname
        FROM pg_inherits i
        JOIN pg_class p ON p.oid = i.inhparent
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_stat_user_tables s ON s.relid = c.oid
        WHERE p.relname IN ('probe_results', 'signal_events', 'inline_reports', 'probe_summaries',
                            'probe_summary_sets', 'probe_rollups', 'probe_rollup_sets', 'probe_rollups_daily')
          AND p.relnamespace = c.relnamespace
          AND n.nspname = ANY (current_schemas(false))
          AND s.last_analyze IS NULL AND s.last_autoanalyze IS NULL
          AND s.n_mod_since_analyze >= min_changes
        ORDER BY c.relname
    LOOP
        EXECUTE format('ANALYZE %I.%I', r.nspname, r.relname);
        RETURN NEXT r.relname;
    END LOOP;
END
$function$;

CREATE OR REPLACE FUNCTION public.railguard_changed_at_source(named text, failed_at timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT named LIKE '%/%' AND EXISTS (
        SELECT 1 FROM inline_source_changes c
        WHERE c.transfer = named
          AND c.observed_at > failed_at - interval '1 hour' AND c.observed_at <= failed_at + interval '1 hour')
$function$;

CREATE OR REPLACE FUNCTION public.railguard_drop_month_partitions_before(parent regclass, keep_from date)
 RETURNS SETOF text
 LANGUAGE sql
AS $function$ SELECT railguard_drop_partitions_ending_by(parent, keep_from, 'month') $function$;

CREATE OR REPLACE FUNCTION public.railguard_drop_partitions_before(parent regclass, keep_from date)
 RETURNS SETOF text
 LANGUAGE sql
AS $function$ SELECT railguard_drop_partitions_ending_by(parent, keep_from, 'day') $function$;

CREATE OR REPLACE FUNCTION public.railguard_drop_partitions_ending_by(parent regclass, keep_from date, span text)
 RETURNS SETOF text
 LANGUAGE plpgsql
AS $function$
DECLARE
    part record;
BEGIN
    IF span NOT IN ('day', 'month') THEN
        RAISE EXCEPTION 'partition span % is not day or month', span;
    END IF;
    FOR part IN
        SELECT c.relname
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = parent
          AND c.relname ~ '_[0-9]{8}$'
          AND (to_date(right(c.relname, 8), 'YYYYMMDD') + ('1 ' || span)::interval) <= keep_from
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %I', part.relname);
        RETURN NEXT part.relname;
    END LOOP;
END;
$function$;

CREATE OR REPLACE FUNCTION public.railguard_ensure_day_partition(parent regclass, day date)
 RETURNS void
 LANGUAGE sql
AS $function$ SELECT railguard_ensure_partition(parent, day, 'day') $function$;

CREATE OR REPLACE FUNCTION public.railguard_ensure_month_partition(parent regclass, day date)
 RETURNS void
 LANGUAGE sql
AS $function$ SELECT railguard_ensure_partition(parent, day, 'month') $function$;

CREATE OR REPLACE FUNCTION public.railguard_ensure_partition(parent regclass, day date, span text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    first date;
    part text;
    col record;
BEGIN
    IF span NOT IN ('day', 'month') THEN
        RAISE EXCEPTION 'partition span % is not day or month', span;
    END IF;
    first := date_trunc(span, day)::date;
    part := format('%s_%s', parent::text, to_char(first, 'YYYYMMDD'));
    PERFORM pg_advisory_xact_lock(hashtext(part));
    IF to_regclass(part) IS NULL THEN
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
            part, parent,
            (first::timestamp AT TIME ZONE 'UTC'),
            ((first + ('1 ' || span)::interval)::timestamp AT TIME ZONE 'UTC'));
        FOR col IN
            SELECT attname, attstattarget FROM pg_attribute
            WHERE attrelid = parent AND attnum > 0 AND NOT attisdropped AND attstattarget >= 0
            ORDER BY attnum
        LOOP
            EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET STATISTICS %s', part, col.attname, col.attstattarget);
        END LOOP;
    END IF;
END;
$function$;

CREATE OR REPLACE FUNCTION public.railguard_failure_misplaced(f jsonb)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT coalesce((f #>> '{diagnosis,untouched}')::bigint, 0) + coalesce((f #>> '{diagnosis,corrupt}')::bigint, 0) = 0
       AND coalesce((f #>> '{diagnosis,stale}')::bigint, 0) + coalesce((f #>> '{diagnosis,misdirected}')::bigint, 0)
           + coalesce((f #>> '{diagnosis,swapped}')::bigint, 0) + coalesce((f #>> '{diagnosis,layout}')::bigint, 0) > 0
$function$;

CREATE OR REPLACE FUNCTION public.railguard_mismatches_changed_at_source(failed jsonb, failed_at timestamp with time zone, mismatches bigint, misplaced bigint)
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN mismatches <= misplaced THEN 0 ELSE least(mismatches - misplaced, (
        SELECT count(*) FROM jsonb_array_elements(failed) x
        WHERE x.value->>'mismatch' = 'true' AND NOT railguard_failure_misplaced(x.value)
          AND railguard_changed_at_source(x.value->>'remote', failed_at))) END
$function$;

CREATE OR REPLACE FUNCTION public.railguard_node_status_row()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO node_status (node_id) VALUES (NEW.node_id) ON CONFLICT (node_id) DO NOTHING;
    RETURN NULL;
END;
$function$;

CREATE OR REPLACE FUNCTION public.railguard_refresh_node_status(of_nodes text[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF of_nodes IS NULL THEN
        of_nodes := ARRAY(SELECT node_id FROM nodes);
    END IF;
    INSERT INTO node_status (node_id, gpus, ok, watch, unknown, at_risk, corrupting, unverified, worst, rank)
    SELECT n.node_id, count(g.gpu_index),
           count(*) FILTER (WHERE g.status = 'ok'),
           count(*) FILTER (WHERE g.status = 'watch'),
           count(*) FILTER (WHERE g.status = 'unknown'),
           count(*) FILTER (WHERE g.status = 'at_risk'),
           count(*) FILTER (WHERE g.status = 'corrupting'),
           count(*) FILTER (WHERE g.verification IN ('unprobed', 'unproven')),
           max(g.status),
           coalesce(array_position(enum_range(NULL::gpu_status_kind), max(g.status)), 0)
    FROM (SELECT DISTINCT unnest(of_nodes) AS node_id) u
         JOIN nodes n ON n.node_id = u.node_id
         LEFT JOIN gpu_status g ON g.node_id = n.node_id
    GROUP BY n.node_id
    ON CONFLICT (node_id) DO UPDATE SET
        gpus = EXCLUDED.gpus, ok = EXCLUDED.ok, watch = EXCLUDED.watch, unknown = EXCLUDED.unknown,
        at_risk = EXCLUDED.at_risk, corrupting = EXCLUDED.corrupting, unverified = EXCLUDED.unverified,
        worst = EXCLUDED.worst, rank = EXCLUDED.rank;
END;
$function$;

CREATE OR REPLACE FUNCTION public.railguard_source_end(name text)
 RETURNS TABLE(node_id text, gpu_index integer, gpu_bdf text, nic text, path text, simulated boolean, announced_by bigint)
 LANGUAGE sql
 STABLE
AS $function$
    SELECT min(w.node_id), min(w.gpu_index), min(w.gpu_bdf), min(w.nic), min(w.path), bool_and(w.simulated),
           count(*)
    FROM source_workers w WHERE w.worker = name
$function$;

CREATE OR REPLACE FUNCTION public.railguard_standing(path text, memory text, node_all_simulated boolean)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE
        WHEN path = 'nic_dma' AND memory = 'cuda' THEN 'nic_gpu_memory'
        WHEN path = 'nic_dma' THEN 'nic_host_memory'
        WHEN path = 'simulated' AND node_all_simulated THEN 'simulated'
        ELSE 'unproven'
    END
$function$;

CREATE OR REPLACE FUNCTION public.railguard_trusted(path text, node_all_simulated boolean)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$ SELECT path = 'nic_dma' OR (path = 'simulated' AND node_all_simulated) $function$;

CREATE TRIGGER nodes_status_row AFTER INSERT ON public.nodes FOR EACH ROW EXECUTE FUNCTION railguard_node_status_row();
