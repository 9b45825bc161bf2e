-- Pair-day rollups (#15 item 2): a GPU's year by day reads 365 × its pairs rows instead of
-- 8,760 × its pairs. Rolled by the leader from the pair-hour rollups of a UTC day once the day
-- has passed (and rolled again while its last hours are re-rolled for late records); same
-- columns and key as `probe_rollups` with `day` (the day's first instant, UTC) for `hour`; same
-- retention (`serve --rollup-retention-days`), partitioned by UTC month.
CREATE TABLE probe_rollups_daily (
    node_id            text        NOT NULL,
    day                timestamptz NOT NULL,
    gpu_index          integer     NOT NULL,
    nic                text        NOT NULL,
    transport          text        NOT NULL,
    memory             text        NOT NULL,
    path               text        NOT NULL,
    injected           text        NOT NULL,
    simulated          boolean     NOT NULL,
    ok                 bigint      NOT NULL,
    silent_corruption  bigint      NOT NULL,
    reported_failure   bigint      NOT NULL,
    timeout            bigint      NOT NULL,
    bytes              bigint      NOT NULL,
    first_failure      timestamptz,
    last_failure       timestamptz,
    rolled_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, gpu_index, day, nic, transport, memory, path, injected, simulated)
) PARTITION BY RANGE (day);
