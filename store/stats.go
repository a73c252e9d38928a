package store

import (
	"database/sql"
	"errors"
	"fmt"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

// StatsAt rebuilds the allocator's statistics (what memory_summary()
// prints) after the last event at or before time t, and returns that
// event's seq (-1 when there is none).
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
	c, last, err := r.statsAtSeq(seq)
	if err != nil {
		return nil, 0, err
	}
	return c.Stats(), last, nil
}

// StatsAtSeq is StatsAt after event seq (or the last event before it).
func (db *DB) StatsAtSeq(id string, seq int64) (*caching.Stats, int64, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, 0, err
	}
	defer r.close()
	c, last, err := r.statsAtSeq(seq)
	if err != nil {
		return nil, 0, err
	}
	return c.Stats(), last, nil
}

// statsAtSeq counts the statistics up to event seq from the latest
// checkpoint that holds them, so it replays at most a checkpoint's worth of
// events; a trace stored before checkpoints held statistics is counted from
// its start. It returns the counter (its layout is the one after the last
// event counted) and that event's seq (-1 when none).
func (r *reader) statsAtSeq(seq int64) (*caching.StatCounter, int64, error) {
	var ck int64
	var data, stats []byte
	err := r.tx.QueryRow("SELECT seq, data, stats FROM checkpoints WHERE tid = ? AND seq <= ? AND stats IS NOT NULL ORDER BY seq DESC LIMIT 1",
		r.tid, seq).Scan(&ck, &data, &stats)
	var c *caching.StatCounter
	switch {
	case errors.Is(err, sql.ErrNoRows):
		initial, err := r.checkpoint(initialSeq)
		if err != nil {
			return nil, 0, fmt.Errorf("trace %s: layout before the trace: %w", r.trace.ID, err)
		}
		ck, c = initialSeq, caching.NewStatCounter(initial, r.trace.Rules)
	case err != nil:
		return nil, 0, err
	default:
		l, err := decodeLayout(data, r.trace.Rules)
		if err != nil {
			return nil, 0, fmt.Errorf("trace %s: checkpoint %d: %w", r.trace.ID, ck, err)
		}
		var st caching.Stats
		if err := st.UnmarshalBinary(stats); err != nil {
			return nil, 0, fmt.Errorf("trace %s: checkpoint %d: %w", r.trace.ID, ck, err)
		}
		c = caching.ResumeStatCounter(l, r.trace.Rules, st)
	}
	last := ck
	if ck == initialSeq {
		last = -1
	}
	err = r.events(ck+1, seq+1, func(e *gpu.Event) bool { c.Apply(*e); last = e.Seq; return true })
	return c, last, err
}
