// Package compare puts two traces side by side: their usage on one axis
// (aligned by time, by training step, by event index or by request), their allocator
// settings, peaks and the memory each needs, and, at each one's peak and
// where they differ most, the live bytes by code location in each and the
// difference (attrib.Group and attrib.Diff). The web page, the JSON API
// and `vramscope compare` all print what Compare returns.
package compare

import (
	"fmt"
	"sort"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/store"
)

// Align is how the two traces are put on one axis.
type Align string

const (
	// ByTime: microseconds since each trace's first event.
	ByTime Align = "time"
	// ByStep: the start of step N of B falls on the start of step N of A
	// (ProfilerStep#N and the like, attrib.Steps); in between, B's time is
	// stretched linearly. The axis is A's microseconds since its first event.
	ByStep Align = "step"
	// ByEvent: the event index since each trace's first event.
	ByEvent Align = "event"
	// ByRequest: the number of requests (alloc and free requests; segment
	// events and completed frees left out) since each trace's first
	// event. The same program under two allocator settings makes the same
	// requests: at each request both hold the same allocations, and what
	// differs is the allocator's (reserved, cached, memory needed).
	ByRequest Align = "request"
	// Auto: by request when both traces make the same requests (the same
	// alloc sizes in the same order), else by time.
	Auto Align = "auto"
)

// ParseAlign reads an alignment's name; "" is Auto.
func ParseAlign(s string) (Align, error) {
	switch a := Align(s); a {
	case "":
		return Auto, nil
	case ByTime, ByStep, ByEvent, ByRequest, Auto:
		return a, nil
	}
	return "", fmt.Errorf("alignment %q is none of time, step, event, request, auto", s)
}

// Options tune a comparison.
type Options struct {
	Align Align
	Group attrib.Grouping
	// Columns is how many columns the timeline has (DefaultColumns when 0).
	Columns int
	// X0, X1 is the window of the aligned axis the timeline covers; when
	// X1 <= X0, the steps of both traces when they have any (a run's
	// loading before them would crush them into its end), else both
	// traces whole.
	X0, X1 int64
	// At, when set, adds a moment at that place of the aligned axis.
	At *int64
	// Rows caps each moment's table (DefaultRows when 0; -1: every row).
	Rows int
	// MaxEvents is how many events of a trace are compared whole
	// (store.MaxEventTotals when 0); a longer trace is sampled.
	MaxEvents int
	// Cats gives the trace's categorizers (their regions read once); nil
	// reads them anew.
	Cats *attrib.Cache
	// Needed says the memory each trace needs (the what-if replays); nil
	// leaves it unknown.
	Needed func(ts ...gpu.Trace) []Needed
}

const (
	DefaultColumns = 1000
	MaxColumns     = 8000
	DefaultRows    = 20
)

// Needed is the smallest device a trace runs on without an OOM under its
// recorded settings, as the what-if replays find it.
type Needed struct {
	// Status is "done", "running" (the replays take a while: ask again)
	// or "unavailable" (Text says why).
	Status string `json:"status"`
	// Bytes is the capacity needed; 0 when done means more than the
	// replays try.
	Bytes uint64 `json:"bytes"`
	// Text is the what-if's sentence (incident.Table.Needed), or why
	// there is none.
	Text string `json:"text,omitempty"`
}

// Side is one of the two traces.
type Side struct {
	gpu.Trace
	// Steps are the starts of its training steps, on the aligned axis.
	Steps []StepMark `json:"steps"`
	// Needed is the memory it needs (Options.Needed).
	Needed Needed `json:"needed"`
	// Range is the aligned positions of its first and last event.
	Range [2]int64 `json:"range"`
	// SampledEvery is 0 when every event is compared; else the trace has
	// more events than a comparison holds, and each kept event stands for
	// this many (those with the least and the most bytes: peaks stay).
	SampledEvery int `json:"sampled_every,omitempty"`
}

// StepMark is the start of training step N on the aligned axis.
type StepMark struct {
	N int   `json:"n"`
	X int64 `json:"x"`
}

// Setting is one allocator setting in both traces.
type Setting struct {
	Key     string `json:"key"`
	A       string `json:"a"`
	B       string `json:"b"`
	Differs bool   `json:"differs"`
}

// Figure is one figure of both traces, and B - A.
type Figure struct {
	Key   string `json:"key"`
	Label string `json:"label"`
	A     uint64 `json:"a"`
	B     uint64 `json:"b"`
	Delta int64  `json:"delta"`
	// Known is false while a figure is not known for both (the memory
	// needed while its replays run); Note says why.
	Known bool   `json:"known"`
	Note  string `json:"note,omitempty"`
}

// Point is an instant of one trace: right after event Seq (-1: before
// its first event), at TimeUS, with Allocated bytes live.
type Point struct {
	Seq       int64  `json:"seq"`
	TimeUS    int64  `json:"t"`
	Allocated uint64 `json:"allocated"`
	Reserved  uint64 `json:"reserved"`
}

// Moment is one aligned instant and what was live there in each trace.
type Moment struct {
	Key   string `json:"key"` // peak_a, peak_b, divergence, at
	Label string `json:"label"`
	X     int64  `json:"x"`
	A     Point  `json:"a"`
	B     Point  `json:"b"`
	// Divergence is B's allocated bytes minus A's; ReservedDelta B's
	// reserved bytes minus A's.
	Divergence    int64 `json:"divergence"`
	ReservedDelta int64 `json:"reserved_delta"`
	// Rows are the groups of both live sets, largest |B - A| first: the
	// first Options.Rows of RowsTotal.
	Rows      []attrib.Delta `json:"rows"`
	RowsTotal int            `json:"rows_total"`
}

// Timeline is both traces' usage over [X0, X1] of the aligned axis in N
// equal columns.
type Timeline struct {
	X0 int64 `json:"x0"`
	X1 int64 `json:"x1"`
	N  int   `json:"n"`
	A  Usage `json:"a"`
	B  Usage `json:"b"`
	// Unit is what the axis counts: "us", "event" or "request".
	Unit string `json:"unit"`
	// Whole is the window that holds both traces whole; Steps says that
	// [X0, X1] is the steps' window, chosen as no window was asked for.
	Whole [2]int64 `json:"whole"`
	Steps bool     `json:"steps_window,omitempty"`
}

// Usage is one trace's allocated bytes (least and greatest) and reserved
// bytes (greatest) in each column.
type Usage struct {
	AllocMin    []uint64 `json:"alloc_min"`
	AllocMax    []uint64 `json:"alloc_max"`
	ReservedMax []uint64 `json:"reserved_max"`
}

// Result is a comparison.
type Result struct {
	A Side `json:"a"`
	B Side `json:"b"`
	// Align is the alignment used; Asked the one asked for, and Note why
	// they differ (a trace without steps is aligned by time, one without
	// times by event).
	Align Align  `json:"align"`
	Asked Align  `json:"align_asked"`
	Note  string `json:"align_note,omitempty"`
	// SameProgram: both traces make the same requests (the same alloc
	// sizes in the same order); Reading says what differs between them
	// then (the allocator's figures), or why they are not one program's.
	SameProgram bool            `json:"same_program"`
	Reading     string          `json:"reading,omitempty"`
	Group       attrib.Grouping `json:"group"`
	Settings    []Setting       `json:"settings"`
	Figures     []Figure        `json:"figures"`
	Timeline    Timeline        `json:"timeline"`
	Moments     []Moment        `json:"moments"`
}

// trace is one side as Compare works on it.
type trace struct {
	t      gpu.Trace
	s      *store.EventTotals
	pos    []int64 // the aligned position of each event
	cats   *attrib.Categorizer
	steps  []attrib.Region
	origin int64
	// place is the aligned position of a time of the trace.
	place  func(us int64) int64
	groups map[int64]*attrib.Grouped // the live sets grouped, by seq
	req    *requests                 // read when aligning by request, or choosing
}

// Compare compares traces a and b of db.
func Compare(db *store.DB, a, b string, o Options) (*Result, error) {
	if o.Align == "" {
		o.Align = Auto
	}
	if o.Group == "" {
		o.Group = attrib.ByFrame
	}
	if o.Columns <= 0 {
		o.Columns = DefaultColumns
	}
	o.Columns = min(o.Columns, MaxColumns)
	if o.Rows == 0 {
		o.Rows = DefaultRows
	}
	var sides [2]*trace
	for i, id := range []string{a, b} {
		t, err := load(db, id, o.Cats, o.MaxEvents)
		if err != nil {
			return nil, err
		}
		sides[i] = t
	}
	ta, tb := sides[0], sides[1]
	res := &Result{Asked: o.Align, Align: o.Align, Group: o.Group}
	if o.Align == Auto || o.Align == ByRequest {
		for _, t := range sides {
			r, err := readRequests(db, t.t)
			if err != nil {
				return nil, err
			}
			t.req = r
		}
		var why string
		res.SameProgram, why = sameProgram(ta.req.sizes, tb.req.sizes)
		switch {
		case res.SameProgram:
			res.Reading = "The same program: both traces make the same requests (alloc sizes, in order). Aligned by request, " +
				"each moment reads both at the same request, where both hold the same allocations (their blocks' sizes differ only by " +
				"the allocator's rounding and splitting): what differs is the allocator's (reserved, cached but not allocated, memory needed)"
		case o.Align == ByRequest:
			res.Reading = "Not the same program: " + why + "; by request, the same place may be different work in each"
		}
		if o.Align == Auto {
			o.Align = ByTime
			if res.SameProgram {
				o.Align = ByRequest
			}
		}
	}
	res.Align, res.Note = align(ta, tb, o.Align)

	// The replays that find the memory needed run while the rest is read.
	needed := make(chan []Needed, 1)
	if o.Needed != nil {
		go func() { needed <- o.Needed(ta.t, tb.t) }()
	} else {
		none := Needed{Status: "unavailable", Text: "not asked"}
		needed <- []Needed{none, none}
	}
	res.A, res.B = side(ta), side(tb)
	res.Settings = settingsDiff(ta.t.Settings, tb.t.Settings)
	more, err := snapshotSettings(db, [2]string{ta.t.Upload, tb.t.Upload})
	if err != nil {
		return nil, err
	}
	res.Settings = append(res.Settings, more...)
	res.Timeline = timeline(ta, tb, res.Align, o)

	// The moments: each trace's peak, where they differ most, and the
	// instant asked for. A peak is read right after its event, not after
	// the last event at its position (a free at the same microsecond).
	type at struct {
		key, label string
		x          int64
		ia, ib     int
	}
	pa, pb := ta.peak(), tb.peak()
	xa, xb := ta.posOf(pa), tb.posOf(pb)
	// By request both hold the same allocations everywhere: they differ
	// most in what the allocator reserved.
	reserved := res.Align == ByRequest
	xd := divergence(ta, tb, reserved)
	most := "Largest divergence"
	if reserved {
		most = "Most apart in reserved"
	}
	moments := []at{
		{"peak_a", "A's peak", xa, pa, tb.index(xa)},
		{"peak_b", "B's peak", xb, ta.index(xb), pb},
		{"divergence", most, xd, ta.index(xd), tb.index(xd)},
	}
	if o.At != nil {
		moments = append(moments, at{"at", "Chosen instant", *o.At, ta.index(*o.At), tb.index(*o.At)})
	}
	for _, m := range moments {
		mo, err := moment(db, ta, tb, m.x, [2]int{m.ia, m.ib}, o)
		if err != nil {
			return nil, err
		}
		mo.Key, mo.Label = m.key, m.label
		res.Moments = append(res.Moments, mo)
	}
	n := <-needed
	res.A.Needed, res.B.Needed = n[0], n[1]
	res.Figures = figures(res.A, res.B, ta, tb)
	return res, nil
}

func load(db *store.DB, id string, cache *attrib.Cache, most int) (*trace, error) {
	var c *attrib.Categorizer
	var err error
	if cache != nil {
		c, err = cache.Categorizer(db, id)
	} else {
		c, err = attrib.NewCategorizer(db, id)
	}
	if err != nil {
		return nil, err
	}
	t, err := db.Trace(id)
	if err != nil {
		return nil, err
	}
	if most <= 0 {
		most = store.MaxEventTotals
	}
	s, err := db.EventTotals(id, most)
	if err != nil {
		return nil, err
	}
	tr := &trace{t: t, s: s, cats: c, steps: attrib.Steps(c.Regions()), groups: map[int64]*attrib.Grouped{}}
	if len(s.TimeUS) > 0 {
		tr.origin = s.TimeUS[0]
	}
	return tr, nil
}

func side(t *trace) Side {
	sd := Side{Trace: t.t, Steps: []StepMark{}}
	if t.s.Every > 1 {
		sd.SampledEvery = t.s.Every
	}
	if n := len(t.pos); n > 0 {
		sd.Range = [2]int64{t.pos[0], t.pos[n-1]}
	}
	for _, st := range t.steps {
		sd.Steps = append(sd.Steps, StepMark{N: st.Step, X: t.place(st.StartUS)})
	}
	return sd
}

// align sets both traces' positions on the aligned axis; the alignment
// used and, when it is not the one asked for, why.
func align(a, b *trace, want Align) (Align, string) {
	note := ""
	// A snapshot without time_us has event indexes for times: on a time
	// axis they would read as microseconds.
	if want != ByEvent && (a.t.NoTime || b.t.NoTime) {
		switch {
		case a.t.NoTime && b.t.NoTime:
			note = "neither trace recorded times (no time_us): aligned by event"
		case a.t.NoTime:
			note = "trace A recorded no times (no time_us): aligned by event"
		default:
			note = "trace B recorded no times (no time_us): aligned by event"
		}
		want = ByEvent
	}
	if want == ByStep {
		ka, kb := knots(a, b)
		if len(ka) > 0 {
			a.place = func(us int64) int64 { return us - a.origin }
			b.place = func(us int64) int64 { return stretch(us, kb, ka) - a.origin }
			for _, t := range []*trace{a, b} {
				t.pos = make([]int64, len(t.s.TimeUS))
				for i, us := range t.s.TimeUS {
					t.pos[i] = t.place(us)
				}
			}
			return ByStep, ""
		}
		switch {
		case len(a.steps) == 0 && len(b.steps) == 0:
			note = "neither trace has step annotations (ProfilerStep#N): aligned by time"
		case len(a.steps) == 0:
			note = "trace A has no step annotations (ProfilerStep#N): aligned by time"
		case len(b.steps) == 0:
			note = "trace B has no step annotations (ProfilerStep#N): aligned by time"
		default:
			note = "the traces have no step number in common: aligned by time"
		}
		want = ByTime
	}
	if want == ByRequest && (a.req == nil || b.req == nil) {
		want, note = ByTime, "the requests were not read: aligned by time"
	}
	for _, t := range []*trace{a, b} {
		t.pos = make([]int64, len(t.s.Seq))
		if want == ByRequest {
			// An event's place is the number of requests up to it; a time
			// is placed at the last event at or before it.
			for i, seq := range t.s.Seq {
				t.pos[i] = t.req.at(seq)
			}
			t.place = func(us int64) int64 {
				if i := sort.Search(len(t.s.TimeUS), func(i int) bool { return t.s.TimeUS[i] > us }) - 1; i >= 0 {
					return t.pos[i]
				}
				return 0
			}
			continue
		}
		if want == ByEvent {
			// An event's place is its index since the first (its seq's
			// distance: the events kept of a sampled trace keep theirs);
			// a time is placed at the first event at or after it.
			for i, seq := range t.s.Seq {
				t.pos[i] = seq - t.s.Seq[0]
			}
			t.place = func(us int64) int64 {
				i := sort.Search(len(t.s.TimeUS), func(i int) bool { return t.s.TimeUS[i] >= us })
				switch {
				case i < len(t.pos):
					return t.pos[i]
				case i == 0:
					return 0
				}
				return t.pos[i-1] + 1 // after the last event
			}
			continue
		}
		t.place = func(us int64) int64 { return us - t.origin }
		for i, us := range t.s.TimeUS {
			t.pos[i] = us - t.origin
		}
	}
	return want, note
}

// knots are the start times of the steps both traces have, by number, in
// A's order, each list increasing.
func knots(a, b *trace) (ka, kb []int64) {
	inB := map[int]int64{}
	for _, st := range b.steps {
		if _, ok := inB[st.Step]; !ok {
			inB[st.Step] = st.StartUS
		}
	}
	seen := map[int]bool{}
	for _, st := range a.steps {
		tb, ok := inB[st.Step]
		if !ok || seen[st.Step] {
			continue
		}
		if n := len(ka); n > 0 && (st.StartUS <= ka[n-1] || tb <= kb[n-1]) {
			continue // out of order: keep the mapping increasing
		}
		seen[st.Step] = true
		ka, kb = append(ka, st.StartUS), append(kb, tb)
	}
	return ka, kb
}

// stretch maps time t of the knots from onto the knots to: linearly
// between two knots, shifted by the nearest knot outside them.
func stretch(t int64, from, to []int64) int64 {
	n := len(from)
	i := sort.Search(n, func(i int) bool { return from[i] > t }) - 1
	switch {
	case i < 0:
		return to[0] + (t - from[0])
	case i >= n-1:
		return to[n-1] + (t - from[n-1])
	}
	f := float64(t-from[i]) / float64(from[i+1]-from[i])
	return to[i] + int64(f*float64(to[i+1]-to[i])+0.5)
}

// index is the last event whose position is at or before x, -1 when none.
func (t *trace) index(x int64) int {
	return sort.Search(len(t.pos), func(i int) bool { return t.pos[i] > x }) - 1
}

// point is the instant right after event index i (-1: before the first).
func (t *trace) point(i int) Point {
	if i < 0 {
		return Point{Seq: -1, TimeUS: t.t.FirstUS, Allocated: t.s.Initial.Allocated, Reserved: t.s.Initial.Reserved}
	}
	return Point{Seq: t.s.Seq[i], TimeUS: t.s.TimeUS[i], Allocated: t.s.Allocated[i], Reserved: t.s.Reserved[i]}
}

func (t *trace) reserved(i int) uint64 {
	if i < 0 {
		return t.s.Initial.Reserved
	}
	return t.s.Reserved[i]
}

func (t *trace) allocated(i int) uint64 {
	if i < 0 {
		return t.s.Initial.Allocated
	}
	return t.s.Allocated[i]
}

// peak is the first event index after which allocated bytes are greatest
// (-1: before the first event).
func (t *trace) peak() int {
	best := -1
	for i, v := range t.s.Allocated {
		if v > t.allocated(best) {
			best = i
		}
	}
	return best
}

// posOf is the aligned position of event index i.
func (t *trace) posOf(i int) int64 {
	if i < 0 {
		if len(t.pos) > 0 {
			return t.pos[0] - 1
		}
		return 0
	}
	return t.pos[i]
}

// divergence is the first aligned position, where both traces are
// recorded, at which their allocated bytes (reserved bytes when reserved)
// differ most.
func divergence(a, b *trace, reserved bool) int64 {
	bytes := (*trace).allocated
	if reserved {
		bytes = (*trace).reserved
	}
	lo, hi := int64(-1<<62), int64(1<<62)
	for _, t := range []*trace{a, b} {
		if n := len(t.pos); n > 0 {
			lo, hi = max(lo, t.pos[0]), min(hi, t.pos[n-1])
		}
	}
	if lo == -1<<62 { // neither has events
		return 0
	}
	if hi < lo { // they do not overlap: compare where the later one starts
		hi = lo
	}
	i, j := a.index(lo), b.index(lo)
	best, bestX := diff(bytes(a, i), bytes(b, j)), lo
	for {
		// The next position either trace moves at.
		x := int64(1 << 62)
		if i+1 < len(a.pos) {
			x = a.pos[i+1]
		}
		if j+1 < len(b.pos) {
			x = min(x, b.pos[j+1])
		}
		if x > hi {
			return bestX
		}
		for i+1 < len(a.pos) && a.pos[i+1] <= x {
			i++
		}
		for j+1 < len(b.pos) && b.pos[j+1] <= x {
			j++
		}
		if d := diff(bytes(a, i), bytes(b, j)); d > best {
			best, bestX = d, x
		}
	}
}

func diff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// grouped is the live set right after event seq, grouped as o asks; the
// trace keeps it, as moments often fall on the same instant.
func (t *trace) grouped(db *store.DB, seq int64, o Options) (*attrib.Grouped, error) {
	if g, ok := t.groups[seq]; ok {
		return g, nil
	}
	// The verdicts name the groups without frames (where they were made)
	// and give the categories.
	l, err := t.cats.At(attrib.Instant{BySeq: true, Seq: seq})
	if err != nil {
		return nil, err
	}
	g := attrib.Group(l.LiveSet, o.Group, attrib.Options{Categories: l.Verdicts})
	t.groups[seq] = g
	return g, nil
}

// moment reads both live sets at aligned position x, right after event
// index at[0] of a and at[1] of b, groups them and diffs the groups.
func moment(db *store.DB, a, b *trace, x int64, at [2]int, o Options) (Moment, error) {
	m := Moment{X: x}
	var groups [2]*attrib.Grouped
	for k, t := range []*trace{a, b} {
		p := t.point(at[k])
		g, err := t.grouped(db, p.Seq, o)
		if err != nil {
			return m, err
		}
		groups[k] = g
		if k == 0 {
			m.A = p
		} else {
			m.B = p
		}
	}
	m.Divergence = int64(m.B.Allocated) - int64(m.A.Allocated)
	m.ReservedDelta = int64(m.B.Reserved) - int64(m.A.Reserved)
	rows := attrib.Diff(groups[0], groups[1])
	m.RowsTotal = len(rows)
	if o.Rows >= 0 && len(rows) > o.Rows {
		rows = rows[:o.Rows]
	}
	if rows == nil {
		rows = []attrib.Delta{}
	}
	m.Rows = rows
	return m, nil
}

func figures(a, b Side, ta, tb *trace) []Figure {
	fig := func(key, label string, x, y uint64) Figure {
		return Figure{Key: key, Label: label, A: x, B: y, Delta: int64(y) - int64(x), Known: true}
	}
	out := []Figure{
		fig("peak_allocated", "Peak allocated", a.PeakAllocated, b.PeakAllocated),
		fig("peak_reserved", "Peak reserved", a.PeakReserved, b.PeakReserved),
	}
	need := fig("memory_needed", "Memory needed", a.Needed.Bytes, b.Needed.Bytes)
	switch {
	case a.Needed.Status != "done" || b.Needed.Status != "done":
		need.Known, need.Delta = false, 0
		need.Note = "the what-if replays " + neededNote(a.Needed, b.Needed) + "; until then, peak reserved is the nearest figure (the most each held as recorded)"
	case a.Needed.Bytes == 0 || b.Needed.Bytes == 0:
		need.Known, need.Delta = false, 0
		need.Note = "more than the replays try for a trace"
	}
	return append(out, need, fig("most_cached", "Most cached, not allocated", ta.mostCached(), tb.mostCached()))
}

func neededNote(a, b Needed) string {
	for _, n := range []Needed{a, b} {
		if n.Status == "running" {
			return "are still running"
		}
	}
	for _, n := range []Needed{a, b} {
		if n.Status != "done" && n.Text != "" {
			return "could not run (" + n.Text + ")"
		}
	}
	return "could not run"
}

// mostCached is the most bytes the allocator held reserved but not
// allocated after any event: what its caching cost at worst.
func (t *trace) mostCached() uint64 {
	most := t.s.Initial.Reserved - min(t.s.Initial.Reserved, t.s.Initial.Allocated)
	for i, r := range t.s.Reserved {
		most = max(most, r-min(r, t.s.Allocated[i]))
	}
	return most
}
