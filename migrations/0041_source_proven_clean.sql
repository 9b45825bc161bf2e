-- A source whose own node proves its pair clean is not the other end to blame. `end_proven_clean`:
-- the name resolves to one node's attested GPU/NIC pair, and that GPU is `ok` with its workload
-- pair (the attested NIC) proven by its own probes in its KV memory. Mismatches from such a source
-- stay the destinations' own (no `remote` finding, no source finding): other nodes' reports alone
-- cannot move a destination's blame onto a pair its own node has proven.
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
  AND NOT (coalesce((x.value #>> '{diagnosis,untouched}')::bigint, 0)
           + coalesce((x.value #>> '{diagnosis,corrupt}')::bigint, 0) = 0
           AND coalesce((x.value #>> '{diagnosis,stale}')::bigint, 0)
               + coalesce((x.value #>> '{diagnosis,misdirected}')::bigint, 0)
               + coalesce((x.value #>> '{diagnosis,swapped}')::bigint, 0) > 0);
