-- What the receiver found beyond the diagnosis: bit flips in corrupt chunks, and its own
-- description (which earlier probe or pair stale/misdirected bytes came from, which chunks moved).
ALTER TABLE probe_results
    ADD COLUMN bit_flips       bigint NOT NULL DEFAULT 0,
    ADD COLUMN receiver_detail text   NOT NULL DEFAULT '';
