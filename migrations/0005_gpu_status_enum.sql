-- A GPU's status as a Postgres enum: only the four statuses can be stored, and the declared
-- order is the severity order, so `ORDER BY status DESC` and `max(status)` put the worst first
-- without a CASE expression in every query.
CREATE TYPE gpu_status_kind AS ENUM ('ok', 'watch', 'at_risk', 'corrupting');

ALTER TABLE gpu_status
    ALTER COLUMN status TYPE gpu_status_kind USING status::gpu_status_kind,
    -- Written but never read: the rules compute the streak from the workload pair's verdicts.
    DROP COLUMN ok_streak;

ALTER TABLE gpu_status_changes
    ALTER COLUMN from_status TYPE gpu_status_kind USING from_status::gpu_status_kind,
    ALTER COLUMN to_status TYPE gpu_status_kind USING to_status::gpu_status_kind;

-- The fleet list orders by severity, then node and GPU.
CREATE INDEX gpu_status_by_severity ON gpu_status (status DESC, node_id, gpu_index);
DROP INDEX gpu_status_by_status;

-- No topology yet means no structural risk known: NULL, not the text 'unknown' beside real levels.
ALTER TABLE gpu_status ALTER COLUMN structural_risk DROP NOT NULL;
UPDATE gpu_status SET structural_risk = NULL WHERE structural_risk = 'unknown';
