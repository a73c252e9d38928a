-- Events an import left out because they contradict the snapshot's own
-- segments, as JSON {"count": N, "first": [{"seq": S, "reason": "..."}]}; ''
-- when none were.
ALTER TABLE traces ADD COLUMN dropped TEXT NOT NULL DEFAULT '';
