-- Of an in-line report's mismatches, those whose every bad block held whole source content of
-- another time or place (stale, misdirected, swapped, as the workload's library told them apart):
-- the engine's block bookkeeping, not the path that moved the bytes. Each failure's diagnosis
-- (its bad blocks by kind) is kept in its `failures` element.
ALTER TABLE inline_reports ADD COLUMN transfers_mismatch_misplaced bigint NOT NULL DEFAULT 0
    CHECK (transfers_mismatch_misplaced >= 0 AND transfers_mismatch_misplaced <= transfers_mismatch);
