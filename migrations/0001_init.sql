-- railguard schema, version 1.
--
-- Hot, append-only history (probe_results, signal_events) is range-partitioned by day on
-- observed_at so retention drops whole partitions and queries prune by time. Their primary
-- key is (record_id, observed_at): a partitioned table's unique key must contain the
-- partition key, and a record's observed_at never changes (it is spooled once, resent as is),
-- so ON CONFLICT on this key makes every retried batch idempotent.

CREATE TABLE nodes (
    node_id              text        PRIMARY KEY,
    hostname             text        NOT NULL DEFAULT '',
    agent_version        text        NOT NULL DEFAULT '',
    first_seen           timestamptz NOT NULL DEFAULT now(),
    last_seen            timestamptz NOT NULL DEFAULT now(),
    -- Highest cumulative count of records the node's spool had to drop (never silent).
    spool_dropped_total  bigint      NOT NULL DEFAULT 0
);

CREATE TABLE topology_snapshots (
    record_id           uuid        PRIMARY KEY,
    node_id             text        NOT NULL REFERENCES nodes (node_id),
    observed_at         timestamptz NOT NULL,
    received_at         timestamptz NOT NULL DEFAULT now(),
    virtualized         text        NOT NULL,
    hypervisor          text        NOT NULL,
    viommu              text        NOT NULL,
    gpudirect           text        NOT NULL,
    kernel_iommu_flags  text        NOT NULL,
    risks               jsonb       NOT NULL,
    warnings            jsonb       NOT NULL
);
CREATE INDEX topology_snapshots_node_time ON topology_snapshots (node_id, observed_at DESC);

CREATE TABLE topology_gpus (
    snapshot_id  uuid    NOT NULL REFERENCES topology_snapshots (record_id) ON DELETE CASCADE,
    gpu_index    integer NOT NULL,
    bdf          text    NOT NULL,
    numa_node    integer NOT NULL,
    name         text    NOT NULL,
    uuid         text    NOT NULL,
    PRIMARY KEY (snapshot_id, gpu_index)
);

CREATE TABLE topology_nics (
    snapshot_id  uuid    NOT NULL REFERENCES topology_snapshots (record_id) ON DELETE CASCADE,
    name         text    NOT NULL,
    bdf          text    NOT NULL,
    numa_node    integer NOT NULL,
    ports        jsonb   NOT NULL,
    netdevs      text[]  NOT NULL,
    PRIMARY KEY (snapshot_id, name)
);

-- One row per unordered device pair as nvidia-smi names them (GPU0, mlx5_0).
CREATE TABLE topology_paths (
    snapshot_id  uuid    NOT NULL REFERENCES topology_snapshots (record_id) ON DELETE CASCADE,
    a            text    NOT NULL,
    b            text    NOT NULL,
    class        text    NOT NULL,
    nvlinks      integer NOT NULL,
    PRIMARY KEY (snapshot_id, a, b)
);

CREATE TABLE probe_results (
    record_id         uuid        NOT NULL,
    node_id           text        NOT NULL,
    observed_at       timestamptz NOT NULL,
    received_at       timestamptz NOT NULL DEFAULT now(),
    gpu_index         integer     NOT NULL,
    gpu_bdf           text,
    nic               text        NOT NULL,
    nic_bdf           text,
    transport         text        NOT NULL,
    bytes             bigint      NOT NULL,
    reported          text        NOT NULL,
    reported_detail   text        NOT NULL,
    verdict           text        NOT NULL,
    diagnosis         text        NOT NULL,
    first_bad_offset  bigint,
    bad_chunks        integer     NOT NULL,
    chunks            integer     NOT NULL,
    duration_ns       bigint      NOT NULL,
    selection         text        NOT NULL,
    simulated         boolean     NOT NULL,
    PRIMARY KEY (record_id, observed_at)
) PARTITION BY RANGE (observed_at);
CREATE INDEX probe_results_gpu_time ON probe_results (node_id, gpu_index, observed_at DESC);

CREATE TABLE signal_events (
    record_id    uuid        NOT NULL,
    node_id      text        NOT NULL,
    observed_at  timestamptz NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    source       text        NOT NULL,
    kind         text        NOT NULL,
    bdf          text,
    gpu_index    integer,
    nic          text        NOT NULL,
    summary      text        NOT NULL,
    attrs        jsonb       NOT NULL,
    PRIMARY KEY (record_id, observed_at)
) PARTITION BY RANGE (observed_at);
CREATE INDEX signal_events_node_time ON signal_events (node_id, observed_at DESC);

-- Creates the UTC-day partition of `parent` holding `day`, once, even under concurrent
-- callers (the advisory lock serialises creators of the same partition). Called by the
-- collector with bound parameters before it inserts rows for a day it has not seen.
CREATE FUNCTION railguard_ensure_day_partition(parent regclass, day date) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    part text := format('%s_%s', parent::text, to_char(day, 'YYYYMMDD'));
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(part));
    IF to_regclass(part) IS NULL THEN
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
            part, parent,
            (day::timestamp AT TIME ZONE 'UTC'),
            ((day + 1)::timestamp AT TIME ZONE 'UTC'));
    END IF;
END;
$$;
