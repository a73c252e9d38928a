package store

import (
	"database/sql"
	"errors"
	"fmt"
	"math"

	"vramscope/gpu"
)

// The stacked "active memory timeline" (memory_viz's), answered per pixel
// column. Every live allocation has its place in one stack, in allocation
// order (those live before the trace began at the bottom, by address):
// each sits on the allocations made before it and slides down when one of
// them is freed. That layout does not depend on the zoom, so zooming
// either axis never moves an allocation; the zoom only decides how each is
// drawn.
//
// Each column is sampled once, at its peak: right after the event of the
// column after which allocated bytes are greatest (a column without events
// shows the state it is in), so that the stack drawn in a column is its
// make-up at the top of the allocated envelope, a spike included.
// Allocations at least a pixel row tall in the visible memory range [M0,
// M1) are bands of their own. The others are folded: consecutive ones in
// the stack make a folded band, at least a pixel row tall where they allow
// and as tall as a run of one group (first user frame, or stack) goes,
// named by the group holding most of its bytes and by its largest
// allocation: never one undifferentiated mass.
//
// Columns are equal spans of time, or, on the event axis (Events), equal
// counts of events. What an answer costs follows its columns, not the
// trace's length (see bandsample.go): a window denser than
// sweepPerColumn events per column gets fewer, wider columns.

const (
	// maxBands and maxRuns cap one answer's bands: on the way to pass
	// them, new bands are twice as tall at least (the rest folded), up to
	// maxCoarsen times; then the smallest are left out.
	maxBands   = 2000
	maxRuns    = 20_000
	maxCoarsen = 3
	// maxFoldRuns caps the folded bands' runs: on the way to pass it, the
	// folds of each gap are merged pairwise once more, up to maxMerges
	// times.
	maxFoldRuns = 30_000
)

// FoldBy is how allocations too small to draw one by one are grouped.
type FoldBy string

const (
	FoldByFrame FoldBy = "frame" // their stacks' first user frame (gpu.StackLabel)
	FoldByStack FoldBy = "stack" // their stacks
)

// BandsQuery is a window of the stacked timeline: [T0, T1] (microseconds)
// over W pixel columns, or with Events the events T0 .. T1-1, and the
// memory range [M0, M1) over H pixel rows. M1 == 0 asks for [0, 1.05 × the
// window's greatest reserved bytes]. Fold groups the folded bands
// (FoldByFrame when empty).
type BandsQuery struct {
	T0, T1 int64
	Events bool
	W, H   int
	M0, M1 uint64
	Fold   FoldBy
}

// Band is one allocation. Runs holds pairs (column, offset): from that
// column on, up to the next pair or past C1, the band spans
// [offset, offset+size) bytes. Offsets are exact at the run's column and
// within a quarter of a pixel row after it.
type Band struct {
	Seq       int64       `json:"seq"` // -1: allocated before the trace began
	Addr      uint64      `json:"address"`
	Size      uint64      `json:"size"`
	Requested uint64      `json:"requested_size"`
	Stack     gpu.StackID `json:"stack,omitempty"`
	C0        int         `json:"c0"`
	C1        int         `json:"c1"`
	Runs      []int64     `json:"runs"`
}

// Fold is a folded band over columns C0..C1: Count allocations next to
// each other in the stack, too small to draw one by one, spanning
// [Offset, Offset+Size) (within a quarter of a pixel row after C0). Group
// holds most of its bytes (an index of Bands.Groups); Rep is its largest
// allocation, which names it and gives it a category.
type Fold struct {
	C0     int    `json:"c0"`
	C1     int    `json:"c1"`
	Offset uint64 `json:"offset"`
	Size   uint64 `json:"size"`
	Group  uint32 `json:"group"`
	Count  int    `json:"count"`
	Rep    Band   `json:"rep"` // without columns and runs
}

// Bands is the stacked timeline of one window: the query's, or for a
// dense one on the time axis, the window widened to whole columns of a
// power of two microseconds.
type Bands struct {
	T0     int64  `json:"t0"`
	T1     int64  `json:"t1"`
	Events bool   `json:"events,omitempty"` // the columns are counts of events, T0 and T1 event indexes
	W      int    `json:"w"`
	M0     uint64 `json:"m0"`
	M1     uint64 `json:"m1"`
	// Allocated is the allocated bytes at each column's sample, its
	// greatest: the envelope the bands are drawn over.
	Allocated []uint64 `json:"allocated"`
	// YMax is the greatest reserved bytes of the usage buckets that cover
	// the window.
	YMax uint64 `json:"y_max"`
	// MinBytes is the least size always drawn as a band of its own (an
	// answer that would pass its caps raises it as it goes: an allocation
	// already drawn as a band stays one).
	MinBytes uint64 `json:"min_bytes"`
	// Sampled says how the stack was sampled: "columns" (every column at
	// its peak, found replaying the window) or "dense" (a dense window's
	// fewer columns, W of them, each at its peak found in the usage
	// pyramid); Samples how many times.
	Sampled string `json:"sampled"`
	Samples int    `json:"samples"`
	Bands   []Band `json:"bands"`
	Folds   []Fold `json:"folds"`
	// Groups name the folds' groups: first user frames or stacks' labels
	// ("" for allocations without frames).
	Groups []string `json:"groups"`
	// Dropped counts the bands past maxBands or maxRuns, left out.
	Dropped int `json:"dropped"`
}

// Bands lays out the stacked timeline of q's window.
func (db *DB) Bands(id string, q BandsQuery) (*Bands, error) {
	if q.W < 1 || q.H < 1 || q.T1 <= q.T0 || q.M1 != 0 && q.M1 <= q.M0 {
		return nil, fmt.Errorf("store: bands need t0 < t1, m0 < m1, w and h >= 1 (got %+v)", q)
	}
	switch q.Fold {
	case "":
		q.Fold = FoldByFrame
	case FoldByFrame, FoldByStack:
	default:
		return nil, fmt.Errorf("store: bands folded by %q: by frame or by stack", q.Fold)
	}
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	out := &Bands{T0: q.T0, T1: q.T1, Events: q.Events, W: q.W, Bands: []Band{}, Folds: []Fold{}, Groups: []string{}}
	win, err := r.columns(q)
	if err != nil {
		return nil, err
	}
	if out.YMax, err = r.reservedTop(db, q, win); err != nil {
		return nil, err
	}
	var dense *densePlan
	if win.seqEnd-win.seq0 > sweepPerColumn*int64(q.W) {
		if dense, err = r.planDense(q, win, 0); err != nil {
			return nil, err
		}
		out.T0, out.T1, out.W = dense.t0, dense.end(), dense.w
	}
	out.Allocated = make([]uint64, out.W)
	out.M0, out.M1 = q.M0, q.M1
	if q.M1 == 0 {
		out.M0, out.M1 = 0, out.YMax+out.YMax/20
	}
	if out.M1 == 0 {
		return out, nil // nothing was ever reserved
	}
	span := out.M1 - out.M0
	row := max(1, (span+uint64(q.H)-1)/uint64(q.H))
	groups := &foldGroups{db: db, r: r, by: q.Fold, bySID: map[gpu.StackID]uint32{}, names: map[string]uint32{}}
	lay := &bandLayout{out: out, w: out.W, minBytes: row, row: row, quantum: max(1, span/uint64(4*q.H)), bandOf: map[bandKey]int32{}, groups: groups}
	live := &liveSet{}
	if dense != nil {
		out.Sampled = "dense"
		err = r.sampleDense(live, lay, dense, win)
	} else {
		out.Sampled, out.Samples = "columns", q.W
		err = r.sweep(live, lay, win)
	}
	if err != nil {
		return nil, err
	}
	lay.finish()
	if groups.err != nil {
		return nil, groups.err
	}
	if groups.list != nil {
		out.Groups = groups.list
	}
	return out, nil
}

// reservedTop is the greatest reserved bytes of the usage buckets that
// cover q's window, as the page's usage answer has them, from the usage
// pyramid: the top of the memory range when none is asked for. On the
// event axis, the window is the time from its first event to its last.
func (r *reader) reservedTop(db *DB, q BandsQuery, win *bandWindow) (uint64, error) {
	t0, t1 := q.T0, q.T1
	if q.Events {
		ts, err := r.timesFrom([]int64{win.seq0 + 1, win.seqEnd}, nil)
		if err != nil {
			return 0, err
		}
		t0, t1 = ts[0], max(ts[0], ts[1])
	}
	u, err := db.UsageOf(r.trace.ID, t0, t1, q.W, SeriesReserved)
	if err != nil {
		return 0, err
	}
	var top uint64
	for _, b := range u.Buckets {
		top = max(top, b.Reserved.Max)
	}
	return top, nil
}

// bandWindow is a bands query's columns: the events before it (up to seq0)
// make its starting state, the events seq0+1..seqEnd fall in its columns.
type bandWindow struct {
	colAxis
	seq0, seqEnd int64
}

// columns finds the events of q's window and how they fall in columns.
func (r *reader) columns(q BandsQuery) (*bandWindow, error) {
	w := &bandWindow{colAxis: colAxis{events: q.Events, t0: q.T0, width: float64(q.T1-q.T0) / float64(q.W), w: q.W}}
	if q.Events {
		s0, s1, err := r.eventWindow(q.T0, q.T1, q.W)
		if err != nil {
			return nil, err
		}
		w.seq0, w.seqEnd = s0-1, s1-1
		return w, nil
	}
	var err error
	if w.seq0, _, _, err = r.stateAt(q.T0, false); err != nil {
		return nil, err
	}
	if w.seqEnd, _, _, err = r.stateAt(q.T1, true); err != nil {
		return nil, err
	}
	return w, nil
}

// colAxis splits a window into w columns of equal spans of time from t0,
// or of equal counts of events (seqs) from event t0.
type colAxis struct {
	events bool
	t0     int64
	width  float64
	w      int
}

// key is what places e in a column: its time, or its seq.
func (a *colAxis) key(e *gpu.Event) int64 {
	if a.events {
		return e.Seq
	}
	return e.TimeUS
}

// col is the column of key k; those before the window in the first one,
// those after it in the last.
func (a *colAxis) col(k int64) int {
	return min(a.w-1, max(0, int(math.Floor(float64(k-a.t0)/a.width))))
}

func (a *colAxis) colOf(e *gpu.Event) int { return a.col(a.key(e)) }

// start is the least key of column c (past the last: math.MaxInt64).
func (a *colAxis) start(c int) int64 {
	switch {
	case c <= 0:
		return math.MinInt64
	case c >= a.w:
		return math.MaxInt64
	}
	k := a.t0 + int64(math.Ceil(float64(c)*a.width))
	for a.col(k-1) >= c {
		k--
	}
	for a.col(k) < c {
		k++
	}
	return k
}

// PeakSeqs is where each of the n columns of a window (q's T0, T1 and
// Events; W is n) is sampled: right after the event of its peak of
// allocated bytes, or for a column without events the last event before
// it (-1: none). The window's events are read once (their totals, no
// live set), or in a window of more than peakSweepPerColumn events per
// column, each column's peak is searched in the usage bucket that the
// usage pyramid says holds it (see bandsample.go), which reads a chunk or
// two per column.
func (db *DB) PeakSeqs(id string, q BandsQuery) ([]int64, error) {
	if q.W < 1 || q.T1 <= q.T0 {
		return nil, fmt.Errorf("store: peaks need t0 < t1 and n >= 1 (got %+v)", q)
	}
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	win, err := r.columns(q)
	if err != nil {
		return nil, err
	}
	if win.seqEnd-win.seq0 > peakSweepPerColumn*int64(q.W) {
		p, err := r.planDense(q, win, q.W)
		if err != nil {
			return nil, err
		}
		return r.densePeaks(p, win)
	}
	out := make([]int64, q.W)
	best := make([]uint64, q.W)
	seen := make([]bool, q.W)
	s := &eventStream{r: r, end: win.seqEnd}
	s.seek(win.seq0 + 1)
	last, applied := -1, win.seq0 // the last column reached, the last event
	for s.peek() {
		c := win.colOf(&s.ev)
		for ; last < c; last++ {
			out[last+1] = applied // columns passed keep the state they are in
		}
		if !seen[c] || s.after.Allocated > best[c] {
			out[c], best[c], seen[c] = s.ev.Seq, s.after.Allocated, true
		}
		applied = s.ev.Seq
		s.take()
	}
	for ; last < q.W-1; last++ {
		out[last+1] = applied
	}
	return out, s.err
}

// timeOf is the time of event seq.
func (r *reader) timeOf(seq int64) (int64, error) {
	c, err := r.oneChunk("first_seq <= ? ORDER BY first_seq DESC LIMIT 1", seq)
	if err != nil || c == nil {
		return 0, errors.Join(err, fmt.Errorf("trace %s: no event %d: %w", r.trace.ID, seq, ErrNotFound))
	}
	if c.lastSeq == seq {
		return c.lastUS, nil
	}
	t := c.lastUS
	err = c.walk(func(e *gpu.Event, _ bool, _ gpu.Totals, _ allocCounts) bool {
		t = e.TimeUS
		return e.Seq < seq
	})
	return t, err
}

// liveAtCheckpoint fills live with the allocations of the latest checkpoint
// at or before seq, and returns that checkpoint's seq (initialSeq for the
// layout before the trace).
func (r *reader) liveAtCheckpoint(seq int64, live *liveSet, lay *bandLayout) (int64, error) {
	var ck int64
	var data []byte
	err := r.tx.QueryRow("SELECT seq, data FROM checkpoints WHERE tid = ? AND seq <= ? ORDER BY seq DESC LIMIT 1", r.tid, seq).Scan(&ck, &data)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("trace %s: no layout checkpoint at or before %d", r.trace.ID, seq)
	}
	if err != nil {
		return 0, err
	}
	if err := lay.load(live, data); err != nil {
		return 0, fmt.Errorf("trace %s: checkpoint %d: %w", r.trace.ID, ck, err)
	}
	return ck, nil
}

// load fills live from a checkpoint, each allocation with its band.
func (l *bandLayout) load(live *liveSet, data []byte) error {
	if err := live.fromCheckpoint(data); err != nil {
		return err
	}
	for i := range live.list {
		e := &live.list[i]
		if b, ok := l.bandOf[keyOf(e)]; ok {
			e.band = b
		}
	}
	return nil
}
