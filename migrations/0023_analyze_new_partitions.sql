-- The planner has no statistics for a partition until it is first analyzed, and autovacuum
-- analyzes one only after its naptime (a minute) once 50 rows plus a tenth of its estimate have
-- changed. A fresh day partition (every midnight, and a fleet starting) is read by the
-- assessment passes meanwhile with default selectivities: in the 10,000-node run one
-- workload-evidence query took 4.7 s about a minute after the tables were made (docs/scaling.md).
-- The assessment leader calls this before each pass: every partition of the history tables in
-- this schema never analyzed (by hand or by autovacuum) with at least `min_changes` rows
-- written is analyzed now (a sample of at most 300 × default_statistics_target rows; it does
-- not block writes). Returns the partitions analyzed. Autovacuum keeps them current after that.
CREATE FUNCTION railguard_analyze_new_partitions(min_changes bigint) RETURNS SETOF text
LANGUAGE plpgsql AS $$
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
$$;
