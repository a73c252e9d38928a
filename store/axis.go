package store

import (
	"fmt"
	"math"

	"vramscope/gpu"
)

// The event axis: a window of events [S0, S1) instead of a time window,
// each event the same width, as PyTorch's memory_viz draws a trace (a
// step of many events gets the room its events need, however briefly it
// ran). Usage and bands answer it column by column of events; the times
// of the columns' first events let a page place what has a time (steps,
// the cursor, incidents) on it.

// maxUsageSweep is the most events an event-axis usage answer decodes;
// past it, columns are read from the chunks' starting totals.
const maxUsageSweep = 4_000_000

// totalsAfter is the totals right after event seq (before the first event
// for a seq before it).
func (r *reader) totalsAfter(seq int64) (gpu.Totals, error) {
	c, err := r.oneChunk("first_seq <= ? ORDER BY first_seq DESC LIMIT 1", seq)
	if err != nil {
		return gpu.Totals{}, err
	}
	if c == nil {
		t, _, err := r.initial()
		return t, err
	}
	t := c.before
	err = c.walk(func(e *gpu.Event, _ bool, at gpu.Totals, _ allocCounts) bool {
		if e.Seq > seq {
			return false
		}
		t = at
		return true
	})
	return t, err
}

// eventWindow clamps [s0, s1) to the trace's events and checks it.
func (r *reader) eventWindow(s0, s1 int64, n int) (int64, int64, error) {
	first, end := max(0, r.trace.FirstSeq), r.trace.LastSeq+1
	if n < 1 || s1 <= s0 {
		return 0, 0, fmt.Errorf("store: an event window needs s0 < s1 and n >= 1 (got [%d, %d), %d)", s0, s1, n)
	}
	return max(s0, first-1), min(s1, max(end, first)), nil
}

// EventUsage is the usage over a window of events in columns of Width
// events from StartUS (column c holds the events s with c ≤ (s -
// StartUS)/Width < c+1), with the
// time of each column's first event (Times[i]; one more for the window's
// end: its last event's time).
type EventUsage struct {
	UsageColumns
	Width float64 `json:"width"`
	Times []int64 `json:"times"`
}

// UsageByEvent summarizes reserved, allocated and active bytes over the
// events [s0, s1) in n columns of equal counts of events: each column the
// least and greatest totals entering it and after each of its events.
func (db *DB) UsageByEvent(id string, s0, s1 int64, n int) (EventUsage, error) {
	r, err := db.begin(id)
	if err != nil {
		return EventUsage{}, err
	}
	defer r.close()
	return usageByEvent(r, s0, s1, n)
}

func usageByEvent(r *reader, s0, s1 int64, n int) (EventUsage, error) {
	s0, s1, err := r.eventWindow(s0, s1, n)
	if err != nil {
		return EventUsage{}, err
	}
	width := max(1, float64(s1-s0)/float64(n))
	n = max(1, int(math.Ceil(float64(s1-s0)/width)))
	out := EventUsage{Width: width, Times: make([]int64, n+1)}
	out.StartUS, out.BucketUS = s0, int64(math.Ceil(width))
	out.Events = make([]int64, n)
	for i := range out.Events {
		out.Events[i] = min(s1-s0, int64(math.Ceil(float64(i+1)*width))) - int64(math.Ceil(float64(i)*width))
	}
	cols := make([][2]gpu.Totals, n) // least, greatest
	colOf := func(seq int64) int { return min(n-1, max(0, int(float64(seq-s0)/width))) }
	t, err := r.totalsAfter(s0 - 1)
	if err != nil {
		return out, err
	}
	seen := make([]bool, n)
	note := func(c int, v gpu.Totals) {
		if !seen[c] {
			seen[c], cols[c] = true, [2]gpu.Totals{v, v}
			return
		}
		cols[c][0], cols[c][1] = minTotals(cols[c][0], v), maxTotals(cols[c][1], v)
	}
	if s1-s0 <= maxUsageSweep {
		last := -1
		err = r.eventsTotals(s0, s1, func(e *gpu.Event, _ bool, at gpu.Totals) bool {
			c := colOf(e.Seq)
			for ; last < c; last++ { // entering each column up to this one
				note(last+1, t)
				out.Times[last+1] = e.TimeUS
			}
			note(c, at)
			t = at
			out.Times[n] = e.TimeUS
			return true
		})
		for ; last < n-1; last++ {
			note(last+1, t)
			out.Times[last+1] = out.Times[n]
		}
	} else {
		err = r.chunkStarts(s0, s1, func(seq, us int64, v gpu.Totals) {
			c := colOf(seq)
			note(c, v)
			if out.Times[c] == 0 {
				out.Times[c] = us
			}
		})
		for c := range n { // columns no chunk starts in carry the one before
			if !seen[c] && c > 0 {
				cols[c], seen[c], out.Times[c] = [2]gpu.Totals{cols[c-1][1], cols[c-1][1]}, true, out.Times[c-1]
			}
		}
		out.Times[n] = r.trace.LastUS
	}
	if err != nil {
		return out, err
	}
	for _, c := range cols {
		out.Reserved = append(out.Reserved, c[0].Reserved, c[1].Reserved)
		out.Allocated = append(out.Allocated, c[0].Allocated, c[1].Allocated)
		out.Active = append(out.Active, c[0].Active, c[1].Active)
	}
	return out, nil
}

// chunkStarts calls fn with the first seq, first time and starting totals
// of the chunks that begin in [s0, s1).
func (r *reader) chunkStarts(s0, s1 int64, fn func(seq, us int64, t gpu.Totals)) error {
	rows, err := r.tx.Query("SELECT first_seq, first_us, reserved0, allocated0, active0 FROM chunks WHERE tid = ? AND first_seq >= ? AND first_seq < ? ORDER BY first_seq",
		r.tid, s0, s1)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var seq, us int64
		var t [3]int64
		if err := rows.Scan(&seq, &us, &t[0], &t[1], &t[2]); err != nil {
			return err
		}
		fn(seq, us, gpu.Totals{Reserved: uint64(t[0]), Allocated: uint64(t[1]), Active: uint64(t[2])})
	}
	return rows.Err()
}

// stackLabel is the label of stack sid of r's trace (gpu.StackLabel), read
// once per trace and stack: stacks never change. An error is kept in *err
// (the first one) and gives "".
func (db *DB) stackLabel(r *reader, sid gpu.StackID, err *error) string {
	key := labelKey{r.trace.ID, sid}
	if v, ok := db.labels.Load(key); ok {
		return v.(string)
	}
	sts := map[gpu.StackID]gpu.Stack{}
	if e := r.stacksOf([]gpu.StackID{sid}, sts); e != nil {
		if *err == nil {
			*err = e
		}
		return ""
	}
	label := gpu.StackLabel(sts[sid])
	db.labels.Store(key, label)
	return label
}

// labelKey names a stack of a trace.
type labelKey struct {
	id  string
	sid gpu.StackID
}

// SeqAt is the last event at or before time t (-1 when none is).
func (db *DB) SeqAt(id string, t int64) (int64, error) {
	r, err := db.begin(id)
	if err != nil {
		return 0, err
	}
	defer r.close()
	seq, _, _, err := r.stateAt(t, true)
	return seq, err
}

// SeqTimes is where events fall in time, for a page to place times on an
// event axis: pairs (seq, time of that event), the first and last events
// and the first event of chunks between them, at most about n pairs.
func (db *DB) SeqTimes(id string, n int) ([][2]int64, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	var all [][2]int64
	err = r.chunkStarts(0, r.trace.LastSeq+1, func(seq, us int64, _ gpu.Totals) { all = append(all, [2]int64{seq, us}) })
	if err != nil || len(all) == 0 {
		return [][2]int64{}, err
	}
	step := max(1, (len(all)+n-1)/max(1, n))
	var out [][2]int64
	for i := 0; i < len(all); i += step {
		out = append(out, all[i])
	}
	return append(out, [2]int64{r.trace.LastSeq, r.trace.LastUS}), nil
}
