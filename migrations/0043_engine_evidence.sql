-- Two more kinds of in-line evidence that are the engine's, not a GPU's or its NIC's.
--
-- `layout`: a failure whose every bad block held the source's bytes rearranged (one transform over
-- the whole transfer: the engine rewrote the blocks after arrival) is misplaced, as one whose bad
-- blocks were all stale, misdirected or swapped.
--
-- `source_changed`: a source-side outcome. The workload serving KV blocks as a source found the
-- blocks of a request it lent out changed before a destination's READ of them was confirmed
-- (reused while lent out). Its failure entry names the transfer as destinations' failures do
-- (`remote`: `<worker>/<request>`). It is taken only from the node that announced the worker, for
-- the GPU it announced (`railguard_source_end`): no other node can claim a change at a source.
-- A destination's mismatch of a transfer so changed at its source is misplaced too: the bytes
-- it read were the engine's reuse, not its path's.
ALTER TABLE inline_reports ADD COLUMN sources_changed bigint NOT NULL DEFAULT 0 CHECK (sources_changed >= 0);
CREATE INDEX inline_reports_sources_changed ON inline_reports (observed_at) WHERE sources_changed > 0;

CREATE FUNCTION railguard_failure_misplaced(f jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((f #>> '{diagnosis,untouched}')::bigint, 0) + coalesce((f #>> '{diagnosis,corrupt}')::bigint, 0) = 0
       AND coalesce((f #>> '{diagnosis,stale}')::bigint, 0) + coalesce((f #>> '{diagnosis,misdirected}')::bigint, 0)
           + coalesce((f #>> '{diagnosis,swapped}')::bigint, 0) + coalesce((f #>> '{diagnosis,layout}')::bigint, 0) > 0
$$;

CREATE VIEW inline_source_changes AS
SELECT r.node_id, r.observed_at, r.gpu_index, x.value->>'remote' AS transfer,
       split_part(x.value->>'remote', '/', 1) AS worker, r.engine
FROM inline_reports r
CROSS JOIN LATERAL jsonb_array_elements(r.failures) x
CROSS JOIN LATERAL railguard_source_end(split_part(x.value->>'remote', '/', 1)) e
WHERE r.sources_changed > 0 AND x.value->>'source_changed' = 'true'
  AND e.announced_by = 1 AND e.node_id = r.node_id AND e.gpu_index = r.gpu_index;

-- Whether the transfer `named` (`<worker>/<request>`), failed at a destination at `failed_at`,
-- changed at its source within an hour of it.
CREATE FUNCTION railguard_changed_at_source(named text, failed_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT named LIKE '%/%' AND EXISTS (
        SELECT 1 FROM inline_source_changes c
        WHERE c.transfer = named
          AND c.observed_at > failed_at - interval '1 hour' AND c.observed_at <= failed_at + interval '1 hour')
$$;

-- A destination report's mismatches that are misplaced by the source's own word (beyond those its
-- own diagnosis made misplaced), at most its mismatches not already misplaced.
CREATE FUNCTION railguard_mismatches_changed_at_source(failed jsonb, failed_at timestamptz, mismatches bigint,
                                                       misplaced bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN mismatches <= misplaced THEN 0 ELSE least(mismatches - misplaced, (
        SELECT count(*) FROM jsonb_array_elements(failed) x
        WHERE x.value->>'mismatch' = 'true' AND NOT railguard_failure_misplaced(x.value)
          AND railguard_changed_at_source(x.value->>'remote', failed_at))) END
$$;

CREATE OR REPLACE VIEW inline_source_failures AS
SELECT r.node_id, r.observed_at, r.gpu_index, r.nic, r.path, r.simulated,
       (x.value->>'at')::timestamptz AS at,
       split_part(x.value->>'remote', '/', 1) AS source,
       x.value->'source' AS claim,
       e.node_id AS end_node, e.gpu_index AS end_gpu, e.gpu_bdf AS end_gpu_bdf, e.nic AS end_nic,
       e.path AS end_path, e.simulated AS end_simulated, e.announced_by,
       CASE WHEN e.announced_by = 1 THEN 'pair:' || e.node_id || '/' || e.gpu_index || '/' || e.nic
            ELSE 'name:' || split_part(x.value->>'remote', '/', 1) END AS source_key,
       (e.announced_by = 1 AND EXISTS (
            SELECT 1 FROM gpu_status s
            WHERE s.node_id = e.node_id AND s.gpu_index = e.gpu_index AND s.status = 'ok' AND s.proven
              AND s.workload_nic = e.nic)) AS end_proven_clean
FROM inline_reports r
CROSS JOIN LATERAL jsonb_array_elements(r.failures) x
CROSS JOIN LATERAL railguard_source_end(split_part(x.value->>'remote', '/', 1)) e
WHERE r.transfers_mismatch > 0 AND r.gpu_index IS NOT NULL AND x.value->>'mismatch' = 'true'
  AND split_part(coalesce(x.value->>'remote', ''), '/', 1) <> ''
  AND NOT railguard_failure_misplaced(x.value)
  AND NOT railguard_changed_at_source(x.value->>'remote', r.observed_at);
