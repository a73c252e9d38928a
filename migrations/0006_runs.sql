-- Runs: the ranks of one job (processes, usually one GPU each), each rank
-- one upload (a snapshot file, a recorded run, a live stream) of one trace
-- per device.
CREATE TABLE runs (
    id         TEXT    PRIMARY KEY,
    name       TEXT    NOT NULL,
    created_us INTEGER NOT NULL,
    world_size INTEGER NOT NULL -- ranks the job had, when known; 0: unknown
) WITHOUT ROWID;
CREATE INDEX runs_name ON runs (name, created_us);

-- The run an upload is a rank of ('' for none) and that rank.
ALTER TABLE uploads ADD COLUMN run  TEXT    NOT NULL DEFAULT '';
ALTER TABLE uploads ADD COLUMN rank INTEGER NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX uploads_run_rank ON uploads (run, rank) WHERE run != '';
