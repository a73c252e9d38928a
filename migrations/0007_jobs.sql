-- Background jobs (a trace's what-if table): taken by one process at a
-- time for a lease it renews while it runs; a job whose lease ran out
-- (its process died) is taken again by the next to ask. Done jobs keep
-- their answer, so it is computed once.
CREATE TABLE jobs (
    key        TEXT    PRIMARY KEY, -- what it answers, e.g. whatif/<trace id>/<last seq>
    trace_id   TEXT    NOT NULL,    -- removed with this trace
    state      TEXT    NOT NULL,    -- running, done
    owner      INTEGER NOT NULL,    -- the process running it (owner_pid's kind)
    lease_us   INTEGER NOT NULL,    -- the owner's until then (Unix microseconds)
    takes      INTEGER NOT NULL,    -- how many times it was taken
    partial    BLOB,                -- what a running job has answered so far
    result     BLOB,                -- a done job's answer
    created_us INTEGER NOT NULL
);
CREATE INDEX jobs_trace ON jobs (trace_id);
