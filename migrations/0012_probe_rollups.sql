-- Storage tiers (#15 item 2): per GPU/NIC pair and UTC hour, what its probes said (full probes
-- and the agents' summaries alike, each counted as the probes it stands for), kept apart by the
-- provenance that decides what they prove. Rolled up by the leader collector once an hour has
-- passed (and again for the two hours before it, for late records); kept a year by default
-- (`serve --rollup-retention-days`), while full probes (`--retention-days`) and summaries
-- (`--summary-retention-days`) have their own retention. Partitioned by UTC month (below), keyed node first
-- and then GPU, so a GPU's year is one index range.
CREATE TABLE probe_rollups (
    node_id            text        NOT NULL,
    hour               timestamptz NOT NULL,
    gpu_index          integer     NOT NULL,
    nic                text        NOT NULL,
    transport          text        NOT NULL,
    memory             text        NOT NULL,
    path               text        NOT NULL,
    injected           text        NOT NULL,
    simulated          boolean     NOT NULL,
    ok                 bigint      NOT NULL,
    silent_corruption  bigint      NOT NULL,
    reported_failure   bigint      NOT NULL,
    timeout            bigint      NOT NULL,
    bytes              bigint      NOT NULL,
    first_failure      timestamptz,
    last_failure       timestamptz,
    rolled_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, gpu_index, hour, nic, transport, memory, path, injected, simulated)
) PARTITION BY RANGE (hour);

-- Rollups are kept a year: one partition per UTC month (13 a year, not 366 days), so a GPU's year
-- is planned and read over a handful of partitions.
CREATE FUNCTION railguard_ensure_month_partition(parent regclass, day date) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    first date := date_trunc('month', day)::date;
    part text := format('%s_%s', parent::text, to_char(first, 'YYYYMMDD'));
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(part));
    IF to_regclass(part) IS NULL THEN
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
            part, parent,
            (first::timestamp AT TIME ZONE 'UTC'),
            ((first + interval '1 month')::timestamp AT TIME ZONE 'UTC'));
    END IF;
END;
$$;

-- Retention for month partitions: drops those whose whole month ends on or before `keep_from`.
CREATE FUNCTION railguard_drop_month_partitions_before(parent regclass, keep_from date) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    part record;
BEGIN
    FOR part IN
        SELECT c.relname
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = parent
          AND c.relname ~ '_[0-9]{8}$'
          AND (to_date(right(c.relname, 8), 'YYYYMMDD') + interval '1 month') <= keep_from
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %I', part.relname);
        RETURN NEXT part.relname;
    END LOOP;
END;
$$;
