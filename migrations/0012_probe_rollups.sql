-- Storage tiers (#15 item 2): per GPU/NIC pair and UTC hour, what its probes said (full probes
-- and the agents' summaries alike, each counted as the probes it stands for), kept apart by the
-- provenance that decides what they prove. Rolled up by the leader collector once an hour has
-- passed (and again for the two hours before it, for late records); kept a year by default
-- (`serve --rollup-retention-days`), while full probes (`--retention-days`) and summaries
-- (`--summary-retention-days`) have their own retention. Partitioned by UTC day, keyed node first
-- and then GPU, so a GPU's year is one index range.
CREATE TABLE probe_rollups (
    node_id            text        NOT NULL,
    hour               timestamptz NOT NULL,
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
    PRIMARY KEY (node_id, gpu_index, hour, nic, transport, memory, path, injected, simulated)
) PARTITION BY RANGE (hour);
