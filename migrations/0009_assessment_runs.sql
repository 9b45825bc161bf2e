-- When the fleet's last full assessment pass finished, and which collector ran it: with several
-- replicas only the leader runs it, and every replica's /metrics reports its age from here.
CREATE TABLE assessment_runs (
    id           integer     PRIMARY KEY CHECK (id = 1),
    finished_at  timestamptz NOT NULL,
    holder       text        NOT NULL
);
