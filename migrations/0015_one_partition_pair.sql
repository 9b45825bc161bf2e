-- One pair of partition functions for every span (day partitions of the hot history, month
-- partitions of the rollups): 0001/0003's day functions and 0012's month functions repeated each
-- other with a different span. The four old names stay, as one-line wrappers, for a replica still
-- running the previous collector during a rolling upgrade.

-- Creates the partition of `parent` holding `day` (its UTC day, or its UTC month when `span` is
-- 'month'), once, even under concurrent callers (the advisory lock serialises creators of the
-- same partition). Named `<parent>_<first day as YYYYMMDD>`.
CREATE FUNCTION railguard_ensure_partition(parent regclass, day date, span text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    first date;
    part text;
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
    END IF;
END;
$$;

-- Retention: drops the partitions of `parent` (of `span`) that end on or before `keep_from`,
-- and returns their names.
CREATE FUNCTION railguard_drop_partitions_ending_by(parent regclass, keep_from date, span text) RETURNS SETOF text
LANGUAGE plpgsql AS $$
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
$$;

CREATE OR REPLACE FUNCTION railguard_ensure_day_partition(parent regclass, day date) RETURNS void
LANGUAGE sql AS $$ SELECT railguard_ensure_partition(parent, day, 'day') $$;
CREATE OR REPLACE FUNCTION railguard_ensure_month_partition(parent regclass, day date) RETURNS void
LANGUAGE sql AS $$ SELECT railguard_ensure_partition(parent, day, 'month') $$;
CREATE OR REPLACE FUNCTION railguard_drop_partitions_before(parent regclass, keep_from date) RETURNS SETOF text
LANGUAGE sql AS $$ SELECT railguard_drop_partitions_ending_by(parent, keep_from, 'day') $$;
CREATE OR REPLACE FUNCTION railguard_drop_month_partitions_before(parent regclass, keep_from date) RETURNS SETOF text
LANGUAGE sql AS $$ SELECT railguard_drop_partitions_ending_by(parent, keep_from, 'month') $$;
