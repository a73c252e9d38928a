package store

import (
	"cmp"
	"slices"

	"vramscope/gpu"
)

// EventTotals is a trace's reserved and allocated bytes before its first
// event and right after each of its events, exactly, or, for a trace of
// more events than asked for, after a sample of them: what comparing two
// traces event by event needs.
type EventTotals struct {
	Initial   gpu.Totals // before the first event
	Seq       []int64
	TimeUS    []int64
	Allocated []uint64
	Reserved  []uint64
	// Every is how many events each sample stands for: 1 when every event
	// is here; else each run of Every events keeps the ones with the least
	// and the most allocated and the most reserved bytes (and the trace
	// its first and last event), so peaks and troughs stay.
	Every int
}

// MaxEventTotals is how many events an EventTotals holds whole (32 bytes
// each); a longer trace is sampled.
const MaxEventTotals = 1 << 22

// EventTotals reads the totals after every event of trace id, decoding each
// chunk once, sampled as EventTotals.Every says when the trace has more
// than most events.
func (db *DB) EventTotals(id string, most int) (*EventTotals, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	init, _, err := r.initial()
	if err != nil {
		return nil, err
	}
	n := max(0, int(r.trace.Events))
	every := 1
	if most = max(most, 6); n > most {
		every = (n + most/3 - 1) / (most / 3)
	}
	out := &EventTotals{Initial: init, Every: every}
	size := min(n, most+2)
	out.Seq, out.TimeUS = make([]int64, 0, size), make([]int64, 0, size)
	out.Allocated, out.Reserved = make([]uint64, 0, size), make([]uint64, 0, size)
	type sample struct {
		seq, t int64
		tot    gpu.Totals
	}
	add := func(s sample) {
		if k := len(out.Seq); k > 0 && out.Seq[k-1] >= s.seq {
			return // kept already
		}
		out.Seq, out.TimeUS = append(out.Seq, s.seq), append(out.TimeUS, s.t)
		out.Allocated, out.Reserved = append(out.Allocated, s.tot.Allocated), append(out.Reserved, s.tot.Reserved)
	}
	var lo, hi, res, last sample
	k := 0 // events in the current run
	flush := func() {
		kept := []sample{lo, hi, res}
		slices.SortFunc(kept, func(a, b sample) int { return cmp.Compare(a.seq, b.seq) })
		for _, s := range kept {
			add(s)
		}
		k = 0
	}
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
			s := sample{e.Seq, e.TimeUS, t}
			if every == 1 || len(out.Seq) == 0 {
				add(s)
				return true
			}
			if k == 0 {
				lo, hi, res = s, s, s
			}
			if t.Allocated < lo.tot.Allocated {
				lo = s
			}
			if t.Allocated > hi.tot.Allocated {
				hi = s
			}
			if t.Reserved > res.tot.Reserved {
				res = s
			}
			last = s
			if k++; k == every {
				flush()
			}
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if every > 1 && k > 0 {
		flush()
	}
	if every > 1 && len(out.Seq) > 0 {
		add(last)
	}
	return out, nil
}
