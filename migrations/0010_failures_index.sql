-- Fleet reads that scale: failure queries (`/api/v1/failures`, the fleet patterns) read only
-- failed probes of a period; this partial index finds them without the ok majority.
CREATE INDEX probe_results_failed_time ON probe_results (observed_at) WHERE verdict <> 'ok';
