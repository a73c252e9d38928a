-- Uploads: one snapshot file or one recorded run, which gave one trace per
-- device. What it said about all its devices is kept here as data, so it
-- can be shown and queried: allocator settings, annotations, and the rest
-- of a snapshot's top level.
CREATE TABLE uploads (
    id         TEXT    PRIMARY KEY,
    name       TEXT    NOT NULL,
    created_us INTEGER NOT NULL,
    settings   TEXT,            -- allocator_settings as written (JSON, key order kept); NULL: none
    top        TEXT    NOT NULL -- the rest of a snapshot's top level (JSON, package pytorch)
) WITHOUT ROWID;

-- The devices of one upload share its upload id; '' for a trace on its own.
ALTER TABLE traces ADD COLUMN upload TEXT NOT NULL DEFAULT '';
CREATE INDEX traces_upload ON traces (upload) WHERE upload != '';

-- Annotations (external_annotations of a snapshot, a workload's steps), in
-- the order written.
CREATE TABLE annotations (
    aid     INTEGER PRIMARY KEY,
    upload  TEXT    NOT NULL, -- its upload; '' for a trace on its own
    tid     INTEGER NOT NULL, -- the trace of its device; 0: the upload stored none
    device  INTEGER NOT NULL,
    time_us INTEGER NOT NULL,
    stage   TEXT    NOT NULL,
    name    TEXT    NOT NULL,
    form    TEXT              -- how a snapshot wrote it beyond these (JSON); NULL as PyTorch writes it
);
CREATE INDEX annotations_trace ON annotations (tid, time_us);
CREATE INDEX annotations_upload ON annotations (upload) WHERE upload != '';

-- What trace entries said beyond the event, one row per distinct
-- combination; NULL where they said nothing.
CREATE TABLE event_extras (
    tid             INTEGER NOT NULL,
    xid             INTEGER NOT NULL, -- from 1
    action          TEXT,             -- an action the event model does not name (annotate)
    compile_context TEXT,
    user_metadata   TEXT,
    form            TEXT,             -- how the entry was written (JSON, package pytorch)
    PRIMARY KEY (tid, xid)
) WITHOUT ROWID;

-- Which events have which extra: the events from first_seq up to the next
-- row's first_seq have extra xid (0: none).
CREATE TABLE event_extra_runs (
    tid       INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    xid       INTEGER NOT NULL,
    PRIMARY KEY (tid, first_seq)
) WITHOUT ROWID;

-- A snapshot's segments as the file wrote them (its final state): the
-- layout replayed from the events keeps neither the size last requested
-- from a free block, nor the file's order, pool ids, segment stacks and
-- forms.
CREATE TABLE snapshot_segments (
    tid         INTEGER NOT NULL,
    n           INTEGER NOT NULL, -- place in the file's segments list (every device's)
    address     INTEGER NOT NULL,
    pool_owner  INTEGER NOT NULL, -- segment_pool_id
    pool_id     INTEGER NOT NULL,
    stack       INTEGER NOT NULL, -- frames at segment allocation (stacks.sid); 0: none
    layout      BLOB    NOT NULL, -- the segment and its blocks (checkpoint encoding)
    form        TEXT,             -- how the segment's dict was written (JSON); NULL as PyTorch writes it
    block_forms TEXT,             -- JSON list of the blocks' forms ("" as PyTorch writes it); NULL: all are
    PRIMARY KEY (tid, n)
) WITHOUT ROWID;
