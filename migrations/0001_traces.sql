-- Traces and everything the viewer reads from them. Every table but traces is
-- keyed by tid, the trace's integer key, so rows stay small; the public id is
-- the random text id.

CREATE TABLE traces (
    tid            INTEGER PRIMARY KEY,
    id             TEXT    NOT NULL UNIQUE,
    name           TEXT    NOT NULL,
    source         TEXT    NOT NULL,
    device_ordinal INTEGER NOT NULL,
    device_name    TEXT    NOT NULL,
    capacity       INTEGER NOT NULL,
    settings       TEXT    NOT NULL,
    rules          TEXT    NOT NULL, -- gpu.Rules as JSON: layouts replay under them
    status         TEXT    NOT NULL,
    owner_pid      INTEGER NOT NULL, -- process writing a live trace
    event_count    INTEGER NOT NULL DEFAULT 0,
    first_seq      INTEGER NOT NULL DEFAULT -1,
    last_seq       INTEGER NOT NULL DEFAULT -1,
    first_us       INTEGER NOT NULL DEFAULT 0,
    last_us        INTEGER NOT NULL DEFAULT 0,
    peak_reserved  INTEGER NOT NULL DEFAULT 0,
    peak_allocated INTEGER NOT NULL DEFAULT 0,
    peak_active    INTEGER NOT NULL DEFAULT 0,
    oom_count      INTEGER NOT NULL DEFAULT 0,
    created_us     INTEGER NOT NULL
);

-- Interned stacks, one row per distinct stack of a trace; frames as JSON.
CREATE TABLE stacks (
    tid    INTEGER NOT NULL,
    sid    INTEGER NOT NULL,
    frames TEXT    NOT NULL,
    PRIMARY KEY (tid, sid)
) WITHOUT ROWID;

-- Events, in chunks of consecutive events encoded as one blob (see
-- store/codec.go). The totals before the chunk and the running counts of
-- allocations let readers answer without decoding the chunks in between.
CREATE TABLE chunks (
    tid         INTEGER NOT NULL,
    first_seq   INTEGER NOT NULL,
    last_seq    INTEGER NOT NULL,
    first_us    INTEGER NOT NULL,
    last_us     INTEGER NOT NULL,
    n           INTEGER NOT NULL,
    reserved0   INTEGER NOT NULL,
    allocated0  INTEGER NOT NULL,
    active0     INTEGER NOT NULL,
    allocs0     INTEGER NOT NULL, -- allocations begun before the chunk
    alloc_bytes0 INTEGER NOT NULL,
    frees0      INTEGER NOT NULL, -- allocations ended before the chunk
    free_bytes0 INTEGER NOT NULL,
    data        BLOB    NOT NULL,
    PRIMARY KEY (tid, first_seq)
);
CREATE INDEX chunks_first_us ON chunks (tid, first_us, first_seq);
CREATE INDEX chunks_last_us ON chunks (tid, last_us, first_us);

-- Usage pyramid: for level k, bucket b holds the events with time_us >> k = b:
-- how many, and min, max and last of reserved, allocated and active bytes
-- after each of them. Only buckets with enough events to be worth a row are
-- stored; readers decode the events of the others.
CREATE TABLE usage_levels (
    tid       INTEGER NOT NULL,
    k         INTEGER NOT NULL,
    b         INTEGER NOT NULL,
    n         INTEGER NOT NULL,
    res_min   INTEGER NOT NULL,
    res_max   INTEGER NOT NULL,
    res_last  INTEGER NOT NULL,
    alloc_min INTEGER NOT NULL,
    alloc_max INTEGER NOT NULL,
    alloc_last INTEGER NOT NULL,
    act_min   INTEGER NOT NULL,
    act_max   INTEGER NOT NULL,
    act_last  INTEGER NOT NULL,
    PRIMARY KEY (tid, k, b)
) WITHOUT ROWID;

-- The layout after event seq (seq = -2^62 for the layout before the trace).
CREATE TABLE checkpoints (
    tid  INTEGER NOT NULL,
    seq  INTEGER NOT NULL,
    data BLOB    NOT NULL,
    PRIMARY KEY (tid, seq)
);

-- Finished allocations, binned by size class and duration class (bit length
-- of free_us - alloc_us) and appended in the order they were freed, many per
-- row. Within a bin an allocation alive at t was freed in (t, t + 2^dclass),
-- so a window query reads a short run of rows per bin.
CREATE TABLE alloc_bins (
    tid       INTEGER NOT NULL,
    sclass    INTEGER NOT NULL,
    dclass    INTEGER NOT NULL,
    min_free  INTEGER NOT NULL,
    first_seq INTEGER NOT NULL, -- free seq of the row's first allocation
    max_free  INTEGER NOT NULL,
    n         INTEGER NOT NULL,
    data      BLOB    NOT NULL,
    PRIMARY KEY (tid, sclass, dclass, min_free, first_seq)
);

-- Which bins a trace has, so queries visit only those.
CREATE TABLE alloc_classes (
    tid    INTEGER NOT NULL,
    sclass INTEGER NOT NULL,
    dclass INTEGER NOT NULL,
    PRIMARY KEY (tid, sclass, dclass)
) WITHOUT ROWID;

-- Allocations still live at the last commit, one blob per trace.
CREATE TABLE alloc_open (
    tid  INTEGER PRIMARY KEY,
    data BLOB NOT NULL
);
