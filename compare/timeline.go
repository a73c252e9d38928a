package compare

// timeline is both traces' usage in o.Columns columns over the window
// o asks for, else over their steps, else over both traces.
func timeline(a, b *trace, al Align, o Options) Timeline {
	w0, w1 := int64(1<<62), int64(-1<<62)
	for _, t := range []*trace{a, b} {
		if n := len(t.pos); n > 0 {
			w0, w1 = min(w0, t.pos[0]), max(w1, t.pos[n-1])
		}
	}
	if w1 < w0 { // neither trace has an event
		w0, w1 = 0, 0
	}
	if w1 <= w0 {
		w0, w1 = min(w0, 0), max(w1, 0)+1
	}
	x0, x1, steps := o.X0, o.X1, false
	if x1 <= x0 {
		x0, x1 = w0, w1
		// From the first step on, with a fiftieth of the steps' span before.
		first := int64(1 << 62)
		for _, t := range []*trace{a, b} {
			if len(t.steps) > 0 {
				first = min(first, t.place(t.steps[0].StartUS))
			}
		}
		if first < 1<<62 {
			if s0 := max(w0, first-(w1-first)/50); s0 > w0 && s0 < w1 {
				x0, steps = s0, true
			}
		}
	}
	unit := "us"
	switch al {
	case ByEvent:
		unit = "event"
	case ByRequest:
		unit = "request"
	}
	return Timeline{X0: x0, X1: x1, N: o.Columns, A: usage(a, x0, x1, o.Columns), B: usage(b, x0, x1, o.Columns), Unit: unit,
		Whole: [2]int64{w0, w1}, Steps: steps}
}

// usage is a trace's least and greatest allocated bytes and greatest
// reserved bytes in each of n columns of [x0, x1]: entering a column and
// after each of its events.
func usage(t *trace, x0, x1 int64, n int) Usage {
	u := Usage{AllocMin: make([]uint64, n), AllocMax: make([]uint64, n), ReservedMax: make([]uint64, n)}
	reserved := func(i int) uint64 {
		if i < 0 {
			return t.s.Initial.Reserved
		}
		return t.s.Reserved[i]
	}
	w := float64(x1-x0) / float64(n)
	i := t.index(x0 - 1)
	for c := range n {
		end := x0 + int64(float64(c+1)*w)
		if c == n-1 {
			end = x1 + 1
		}
		lo, hi, res := t.allocated(i), t.allocated(i), reserved(i)
		for i+1 < len(t.pos) && t.pos[i+1] < end {
			i++
			v := t.s.Allocated[i]
			lo, hi, res = min(lo, v), max(hi, v), max(res, t.s.Reserved[i])
		}
		u.AllocMin[c], u.AllocMax[c], u.ReservedMax[c] = lo, hi, res
	}
	return u
}
