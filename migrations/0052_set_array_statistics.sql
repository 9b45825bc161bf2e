-- Planner statistics on the evidence sets' arrays. A summary set holds its pairs in twenty arrays
-- (64 elements each for a node of 8 GPUs and 8 NICs) and a rollup set in fifteen; no query
-- filters on them (a set is found by its node and time and its arrays unnested after), yet
-- ANALYZE gathers element statistics over every sampled row's every element: in the 100,000-node
-- benchmark each automatic analyze of the day's summary sets took 6–7 s of one of the machine's
-- two cores, and ingest stalled behind it (docs/scaling.md). The arrays' statistics target is 0
-- (not gathered), on the tables, their partitions, and the partitions made from now on.
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT a.attrelid::regclass AS rel, a.attname
        FROM pg_attribute a
        JOIN pg_type t ON t.oid = a.atttypid
        WHERE a.attrelid IN ('probe_summary_sets'::regclass, 'probe_rollup_sets'::regclass)
          AND a.attnum > 0 AND NOT a.attisdropped AND t.typcategory = 'A'
        ORDER BY a.attrelid, a.attnum
    LOOP
        -- Recurses to the partitions that exist.
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET STATISTICS 0', c.rel, c.attname);
    END LOOP;
END
$$;

-- A new partition takes its parent's per-column statistics targets (CREATE TABLE … PARTITION OF
-- does not copy them).
CREATE OR REPLACE FUNCTION railguard_ensure_partition(parent regclass, day date, span text) RETURNS void
LANGUAGE plpgsql AS $$
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
$$;
