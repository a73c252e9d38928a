package attrib

import (
	"fmt"
	"slices"

	"vramscope/gpu"
)

// Opening is where a trace's view opens when its URL names no window: on
// what a first look should see. T0, T1 are times; E0, E1 the same stretch
// as event indexes (the events E0..E1-1), for the event axis. Note says
// what was left out, "" when the window is the whole trace.
type Opening struct {
	T0, T1 int64
	E0, E1 int64
	Note   string
}

// steadyFactor: a step at most this many times the median step's length
// is a steady one; the longer ones before the first of them are warm-up
// (cuBLAS workspaces, first allocations, compilation).
const steadyFactor = 1.5

// openSteps is the most steady steps the view opens on: enough to see a
// step's shape repeat, few enough that each is wide (a run of hundreds of
// steps would otherwise open as a blur).
const openSteps = 8

// busyShare is the share of the events the opening window of a trace
// without steps holds, and outShare the least share of the trace it must
// leave out to be worth opening on (else the whole trace opens).
const busyShare, outShare = 0.95, 0.5

// Opening finds where the view of c's trace opens. Where steps are known,
// on the first openSteps steady steps: those from the first at most
// steadyFactor times the median step's length on, the warm-up steps and
// whatever came before them (loading a model) left of the window, when they
// take a tenth of the trace or more or when later steps are left out too. Without steps, on the shortest stretch that holds
// busyShare of the events, when it leaves half of the trace or more out
// (events at the start, then a long wait, then the work). Else the whole
// trace.
func (c *Categorizer) Opening() (Opening, error) {
	t := c.trace
	whole := Opening{T0: t.FirstUS, T1: t.LastUS, E0: max(0, t.FirstSeq), E1: t.LastSeq + 1}
	span := t.LastUS - t.FirstUS
	if t.NoTime || span <= 0 || t.Events == 0 {
		return whole, nil
	}
	var out Opening
	if steps := Steps(c.regions); len(steps) >= 2 {
		k := steadyFrom(steps)
		end := min(len(steps), k+openSteps) // the steps shown: k .. end-1
		first := steps[k].StartUS
		if end == len(steps) && first-t.FirstUS < span/10 {
			return whole, nil
		}
		out.T1 = t.LastUS
		if end < len(steps) {
			out.T1 = steps[end-1].EndUS
		}
		out.T0 = max(t.FirstUS, first-(out.T1-first)/30)
		shown := fmt.Sprintf("steps %d–%d", steps[k].Step, steps[end-1].Step)
		if end < len(steps) {
			shown += fmt.Sprintf(" of %d–%d", steps[0].Step, steps[len(steps)-1].Step)
		}
		switch {
		case k == 0 && first-t.FirstUS < span/10:
			out.Note = fmt.Sprintf("Opened on %s.", shown)
		case k == 0:
			out.Note = fmt.Sprintf("Opened on %s: the %s before them are left of the window.", shown, gpu.FormatDuration(first-t.FirstUS))
		case k == 1:
			out.Note = fmt.Sprintf("Opened on %s, the steady ones: step %d (warm-up, %s) and the %s before it are left of the window.",
				shown, steps[0].Step, gpu.FormatDuration(steps[0].EndUS-steps[0].StartUS), gpu.FormatDuration(steps[0].StartUS-t.FirstUS))
		default:
			out.Note = fmt.Sprintf("Opened on %s, the steady ones: steps %d–%d (warm-up, %s) and the %s before them are left of the window.",
				shown, steps[0].Step, steps[k-1].Step, gpu.FormatDuration(first-steps[0].StartUS), gpu.FormatDuration(steps[0].StartUS-t.FirstUS))
		}
	} else {
		t0, t1, err := c.busiest()
		if err != nil || t1-t0 > span-int64(outShare*float64(span)) {
			return whole, err
		}
		pad := max(1, (t1-t0)/30)
		out.T0, out.T1 = max(t.FirstUS, t0-pad), min(t.LastUS, t1+pad)
		out.Note = fmt.Sprintf("Opened on the %s where %.0f %% of the events are, out of %s.", gpu.FormatDuration(out.T1-out.T0), 100*busyShare, gpu.FormatDuration(span))
	}
	e0, err := c.db.SeqAt(t.ID, out.T0-1)
	if err != nil {
		return whole, err
	}
	e1, err := c.db.SeqAt(t.ID, out.T1)
	if err != nil {
		return whole, err
	}
	out.E0, out.E1 = e0+1, e1+1
	return out, nil
}

// steadyFrom is the index of the first steady step.
func steadyFrom(steps []Region) int {
	lens := make([]int64, len(steps))
	for i, s := range steps {
		lens[i] = s.EndUS - s.StartUS
	}
	sorted := slices.Clone(lens)
	slices.Sort(sorted)
	median := sorted[len(sorted)/2]
	for i, l := range lens {
		if float64(l) <= steadyFactor*float64(median) {
			return i
		}
	}
	return 0
}

// busiest is the shortest stretch of the trace that holds busyShare of its
// events, to the usage pyramid's resolution at about 2000 columns.
func (c *Categorizer) busiest() (t0, t1 int64, err error) {
	t := c.trace
	u, err := c.db.Usage(t.ID, t.FirstUS, t.LastUS, 2000)
	if err != nil || len(u.Buckets) == 0 {
		return t.FirstUS, t.LastUS, err
	}
	var total int64
	for _, b := range u.Buckets {
		total += b.Events
	}
	need := int64(busyShare * float64(total))
	best := [2]int{0, len(u.Buckets) - 1}
	var in int64
	lo := 0
	for hi, b := range u.Buckets { // the shortest run of buckets from lo to hi holding need
		in += b.Events
		for lo < hi && in-u.Buckets[lo].Events >= need {
			in -= u.Buckets[lo].Events
			lo++
		}
		if in >= need && u.Buckets[hi].StartUS-u.Buckets[lo].StartUS < u.Buckets[best[1]].StartUS-u.Buckets[best[0]].StartUS {
			best = [2]int{lo, hi}
		}
	}
	return max(t.FirstUS, u.Buckets[best[0]].StartUS), min(t.LastUS, u.Buckets[best[1]].StartUS+u.BucketUS), nil
}
