package store

import (
	"vramscope/gpu"
	"vramscope/gpu/caching"
)

// StatsAt rebuilds the allocator's statistics (what memory_summary()
// prints) after the last event at or before time t, and returns that
// event's seq (-1 when there is none). It counts every event from the
// trace's start, so its cost follows the events before t.
func (db *DB) StatsAt(id string, t int64) (*caching.Stats, int64, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, 0, err
	}
	defer r.close()
	seq, _, _, err := r.stateAt(t, true)
	if err != nil {
		return nil, 0, err
	}
	initial, _, err := r.layoutAtSeq(-1)
	if err != nil {
		return nil, 0, err
	}
	c := caching.NewStatCounter(initial, r.trace.Rules)
	err = r.events(0, seq+1, func(e *gpu.Event) bool { c.Apply(*e); return true })
	return c.Stats(), seq, err
}
