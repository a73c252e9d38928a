package store

import (
	"errors"
	"fmt"

	"vramscope/gpu"
)

// EventTotals is a trace's reserved and allocated bytes before its first event
// and right after each event, exactly: what comparing two traces event by
// event needs.
type EventTotals struct {
	Initial   gpu.Totals // before the first event
	Seq       []int64
	TimeUS    []int64
	Allocated []uint64
	Reserved  []uint64
}

// MaxEventTotals bounds the events an EventTotals holds (32 bytes each).
const MaxEventTotals = 1 << 22

// ErrTooLong is a trace with more events than an EventTotals holds.
var ErrTooLong = errors.New("too many events")

// EventTotals reads the totals after every event of trace id, decoding each
// chunk once.
func (db *DB) EventTotals(id string) (*EventTotals, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	if r.trace.Events > MaxEventTotals {
		return nil, fmt.Errorf("trace %s has %d events, more than the %d one read holds: %w", id, r.trace.Events, MaxEventTotals, ErrTooLong)
	}
	init, _, err := r.initial()
	if err != nil {
		return nil, err
	}
	n := max(0, r.trace.Events)
	out := &EventTotals{Initial: init, Seq: make([]int64, 0, n), TimeUS: make([]int64, 0, n),
		Allocated: make([]uint64, 0, n), Reserved: make([]uint64, 0, n)}
	rows, err := r.tx.Query("SELECT "+chunkCols+" FROM chunks WHERE tid = ? AND first_seq <= ? ORDER BY first_seq", r.tid, r.trace.LastSeq)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		c, err := scanChunk(rows)
		if err != nil {
			return nil, err
		}
		err = c.walk(func(e *gpu.Event, _ bool, t gpu.Totals, _ allocCounts) bool {
			if e.Seq > r.trace.LastSeq {
				return false
			}
			out.Seq, out.TimeUS = append(out.Seq, e.Seq), append(out.TimeUS, e.TimeUS)
			out.Allocated, out.Reserved = append(out.Allocated, t.Allocated), append(out.Reserved, t.Reserved)
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	return out, rows.Err()
}
