-- Source workers: a KV source (a prefill worker) announced to its own node's agent under the name
-- destinations' failures name it by, with the GPU the process holds and the NIC its transfers
-- use, as that agent attributed them. One row per (worker, node): the latest announcement. A
-- destination's failure naming the worker resolves to the row of the one node that announced it
-- (read/sources.rs); a name two nodes announce resolves to neither.
CREATE TABLE source_workers (
    worker      text        NOT NULL,
    node_id     text        NOT NULL,
    observed_at timestamptz NOT NULL,
    record_id   uuid        NOT NULL,
    gpu_index   integer     NOT NULL,
    gpu_bdf     text,
    gpu_uuid    text        NOT NULL DEFAULT '',
    nic         text        NOT NULL DEFAULT '',
    nic_bdf     text,
    pid         bigint      NOT NULL,
    process     text        NOT NULL,
    path        text        NOT NULL,
    attribution text        NOT NULL,
    simulated   boolean     NOT NULL DEFAULT false,
    engine      jsonb,
    PRIMARY KEY (worker, node_id)
);
CREATE INDEX source_workers_node ON source_workers (node_id, observed_at DESC);

-- The source end a name resolves to: the one node that announced it, with the GPU and NIC its
-- agent attributed. One row always: `announced_by` is how many nodes announced the name; the
-- other columns are meaningful only where it is 1 (none: unknown; two or more: disputed, and
-- nobody's).
CREATE FUNCTION railguard_source_end(name text)
RETURNS TABLE (node_id text, gpu_index integer, gpu_bdf text, nic text, path text, simulated boolean,
               announced_by bigint)
LANGUAGE sql STABLE AS $$
    SELECT min(w.node_id), min(w.gpu_index), min(w.gpu_bdf), min(w.nic), min(w.path), bool_and(w.simulated),
           count(*)
    FROM source_workers w WHERE w.worker = name
$$;

-- Every mismatched in-line transfer that names its source (`remote` before its first `/`), with
-- the destination that got it, the source end its manifest claimed, and the end the name resolves
-- to. `source_key` is what a source is counted by: the attested GPU/NIC pair where one node
-- announced the name (two names on one pair are one source), else the name. A failure whose every
-- bad block held whole source blocks of another time or place (misplaced) is the engine's,
-- whichever end: not here.
CREATE VIEW inline_source_failures AS
SELECT r.node_id, r.observed_at, r.gpu_index, r.nic, r.path, r.simulated,
       (x.value->>'at')::timestamptz AS at,
       split_part(x.value->>'remote', '/', 1) AS source,
       x.value->'source' AS claim,
       e.node_id AS end_node, e.gpu_index AS end_gpu, e.gpu_bdf AS end_gpu_bdf, e.nic AS end_nic,
       e.path AS end_path, e.simulated AS end_simulated, e.announced_by,
       CASE WHEN e.announced_by = 1 THEN 'pair:' || e.node_id || '/' || e.gpu_index || '/' || e.nic
            ELSE 'name:' || split_part(x.value->>'remote', '/', 1) END AS source_key
FROM inline_reports r
CROSS JOIN LATERAL jsonb_array_elements(r.failures) x
CROSS JOIN LATERAL railguard_source_end(split_part(x.value->>'remote', '/', 1)) e
WHERE r.transfers_mismatch > 0 AND r.gpu_index IS NOT NULL AND x.value->>'mismatch' = 'true'
  AND split_part(coalesce(x.value->>'remote', ''), '/', 1) <> ''
  AND NOT (coalesce((x.value #>> '{diagnosis,untouched}')::bigint, 0)
           + coalesce((x.value #>> '{diagnosis,corrupt}')::bigint, 0) = 0
           AND coalesce((x.value #>> '{diagnosis,stale}')::bigint, 0)
               + coalesce((x.value #>> '{diagnosis,misdirected}')::bigint, 0)
               + coalesce((x.value #>> '{diagnosis,swapped}')::bigint, 0) > 0);
