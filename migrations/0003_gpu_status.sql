-- Assessment results: the current status of every GPU, and every change of it.

CREATE TABLE gpu_status (
    node_id          text        NOT NULL,
    gpu_index        integer     NOT NULL,
    status           text        NOT NULL,
    since            timestamptz NOT NULL,
    assessed_at      timestamptz NOT NULL,
    workload_nic     text,
    structural_risk  text        NOT NULL,
    reasons          jsonb       NOT NULL,
    recommendation   text,
    -- Consecutive verified probes on the workload pair, newest first (hysteresis).
    ok_streak        integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (node_id, gpu_index)
);
CREATE INDEX gpu_status_by_status ON gpu_status (status);

CREATE TABLE gpu_status_changes (
    id           bigserial   PRIMARY KEY,
    node_id      text        NOT NULL,
    gpu_index    integer     NOT NULL,
    at           timestamptz NOT NULL,
    from_status  text,
    to_status    text        NOT NULL,
    reasons      jsonb       NOT NULL
);
CREATE INDEX gpu_status_changes_gpu_time ON gpu_status_changes (node_id, gpu_index, at DESC);

-- Retention: drops whole day partitions of `parent` that end before `keep_from`; returns their names.
CREATE FUNCTION railguard_drop_partitions_before(parent regclass, keep_from date) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    part record;
BEGIN
    FOR part IN
        SELECT c.relname
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = parent
          AND c.relname ~ '_[0-9]{8}$'
          AND to_date(right(c.relname, 8), 'YYYYMMDD') < keep_from
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %I', part.relname);
        RETURN NEXT part.relname;
    END LOOP;
END;
$$;
