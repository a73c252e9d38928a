package store

import (
	"fmt"
	"sort"

	"vramscope/gpu"
)

// Span is the time range [T0, T1] of a trace.
type Span struct{ T0, T1 int64 }

// Peak is where allocated bytes were greatest in a span: right after event
// Seq (-1: before the trace's first event), at TimeUS.
type Peak struct {
	Seq       int64  `json:"seq"`
	TimeUS    int64  `json:"time_us"`
	Allocated uint64 `json:"allocated_bytes"`
}

// Peaks finds, for each span, the first event in it after which allocated
// bytes stood at their greatest in the span; the state entering the span
// when no event in it goes higher. It decodes the events from the earliest
// span's start to the latest one's end, once: the cost follows them.
func (db *DB) Peaks(id string, spans []Span) ([]Peak, error) {
	out := make([]Peak, len(spans))
	if len(spans) == 0 {
		return out, nil
	}
	for i, s := range spans {
		if s.T1 < s.T0 {
			return nil, fmt.Errorf("store: span %d ends (%d) before it starts (%d)", i, s.T1, s.T0)
		}
	}
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	order := make([]int, len(spans))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return spans[order[a]].T0 < spans[order[b]].T0 })
	lo, hi := spans[order[0]].T0, spans[0].T1
	for _, s := range spans {
		hi = max(hi, s.T1)
	}
	seq, tot, _, err := r.stateAt(lo, false)
	if err != nil {
		return nil, err
	}
	at := r.trace.FirstUS
	if seq >= 0 {
		if at, err = r.timeOf(seq); err != nil {
			return nil, err
		}
	}
	next := 0      // the next span of order to enter
	var open []int // spans entered and not yet left
	enter := func(t int64) {
		for next < len(order) && spans[order[next]].T0 <= t {
			i := order[next]
			out[i] = Peak{Seq: seq, TimeUS: at, Allocated: tot.Allocated}
			open = append(open, i)
			next++
		}
	}
	err = r.eventsWithEnds(seq+1, r.trace.LastSeq+1, func(e *gpu.Event, ends bool) bool {
		if e.TimeUS > hi {
			return false
		}
		enter(e.TimeUS)
		tot.Apply(e, ends)
		seq, at = e.Seq, e.TimeUS
		kept := open[:0]
		for _, i := range open {
			if e.TimeUS > spans[i].T1 {
				continue
			}
			if tot.Allocated > out[i].Allocated {
				out[i] = Peak{Seq: e.Seq, TimeUS: e.TimeUS, Allocated: tot.Allocated}
			}
			kept = append(kept, i)
		}
		open = kept
		return true
	})
	enter(hi) // spans after the last event: the state they begin in
	return out, err
}
