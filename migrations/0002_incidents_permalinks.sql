-- OOM incidents: one row per oom event, numbered from 1 within a trace, so
-- incident pages need no scan of the events.
CREATE TABLE incidents (
    tid         INTEGER NOT NULL,
    n           INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    time_us     INTEGER NOT NULL,
    size        INTEGER NOT NULL, -- the rounded request
    device_free INTEGER NOT NULL,
    stream      INTEGER NOT NULL,
    stack       INTEGER NOT NULL,
    PRIMARY KEY (tid, n)
) WITHOUT ROWID;

-- Permalinks: an unguessable token for an exact view (JSON state). Rows are
-- never changed; they outlive restarts and are removed with their trace.
CREATE TABLE permalinks (
    token      TEXT    PRIMARY KEY,
    trace_id   TEXT    NOT NULL,
    state      TEXT    NOT NULL,
    created_us INTEGER NOT NULL
);
CREATE INDEX permalinks_trace ON permalinks (trace_id);
