-- Background jobs: see the SQLite migration 0007_jobs.sql.
CREATE TABLE jobs (
    key        text   PRIMARY KEY,
    trace_id   text   NOT NULL,
    state      text   NOT NULL,
    owner      bigint NOT NULL,
    lease_us   bigint NOT NULL,
    takes      bigint NOT NULL,
    partial    bytea,
    result     bytea,
    created_us bigint NOT NULL
);
CREATE INDEX jobs_trace ON jobs (trace_id);
CREATE INDEX jobs_lease ON jobs (lease_us) WHERE state = 'running';
