-- has_time is 0 when the source recorded no times (time_us is then the
-- event's index); peak_seq and peak_us name the first event at the peak of
-- allocated bytes (-1: none, or a trace stored before they were kept).
ALTER TABLE traces ADD COLUMN has_time INTEGER NOT NULL DEFAULT 1;
ALTER TABLE traces ADD COLUMN peak_seq INTEGER NOT NULL DEFAULT -1;
ALTER TABLE traces ADD COLUMN peak_us INTEGER NOT NULL DEFAULT 0;

-- The allocator statistics (memory_stats()) after a checkpoint's event, so
-- memory_summary() at any instant replays at most a checkpoint's worth of
-- events. NULL in checkpoints written before this column.
ALTER TABLE checkpoints ADD COLUMN stats BLOB;
