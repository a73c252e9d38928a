package store

import (
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

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
// counts of events. A window holding more than maxSweep events would cost
// too much to replay; it is sampled at the stored layout checkpoints
// instead (one every checkpointEvery events or more, at most maxSamples of
// them), each sample standing for the columns up to the next one.

// maxSweep is the most events a bands answer replays (a variable for
// tests).
var maxSweep int64 = 2_000_000

const (
	// maxSamples caps the checkpoints a dense window is sampled at.
	maxSamples = 400
	// maxBands and maxRuns cap one answer's bands: past them the layout
	// is done again with bands twice as tall at least (the rest folded),
	// up to maxCoarsen times; then the smallest are left out.
	maxBands   = 2000
	maxRuns    = 20_000
	maxCoarsen = 3
	// maxFoldRuns caps the folded bands' runs: past it, neighbouring folds
	// are merged pairwise.
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

// Bands is the stacked timeline of one window.
type Bands struct {
	T0     int64  `json:"t0"`
	T1     int64  `json:"t1"`
	Events bool   `json:"events,omitempty"` // the columns are counts of events, T0 and T1 event indexes
	W      int    `json:"w"`
	M0     uint64 `json:"m0"`
	M1     uint64 `json:"m1"`
	// Allocated is the greatest allocated bytes in each column: the
	// envelope the bands are drawn over.
	Allocated []uint64 `json:"allocated"`
	YMax      uint64   `json:"y_max"` // greatest reserved bytes in the window
	// MinBytes is the least size drawn as a band of its own.
	MinBytes uint64 `json:"min_bytes"`
	// Sampled says how the stack was sampled: "columns" (each column at
	// its peak) or "checkpoints" (a dense window); Samples how many times.
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
	out := &Bands{T0: q.T0, T1: q.T1, Events: q.Events, W: q.W, Allocated: make([]uint64, q.W), Bands: []Band{}, Folds: []Fold{}, Groups: []string{}}
	win, err := r.columns(q)
	if err != nil {
		return nil, err
	}
	dense := win.seqEnd-win.seq0 > maxSweep
	var peaks []colPeak
	if dense {
		err = r.envelope(db, id, q, out)
	} else {
		peaks, err = r.peaks(win, out)
	}
	if err != nil {
		return nil, err
	}
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
	for coarsen := 0; ; coarsen++ {
		out.MinBytes = row << coarsen
		lay := &bandLayout{out: out, minBytes: out.MinBytes, row: row, quantum: max(1, span/uint64(4*q.H)), bandOf: map[bandKey]int32{}, groups: groups}
		live := &liveSet{}
		ck, err := r.liveAtCheckpoint(win.seq0, live, lay)
		if err != nil {
			return nil, err
		}
		if dense {
			out.Sampled = "checkpoints"
			err = r.sampleCheckpoints(live, lay, ck, win.seq0, win.seqEnd, win.colOfSeq)
		} else {
			out.Sampled, out.Samples = "columns", q.W
			err = r.sweep(live, lay, ck, win, peaks)
		}
		if err != nil {
			return nil, err
		}
		if len(lay.bands) <= maxBands && lay.runs <= maxRuns || coarsen == maxCoarsen {
			lay.finish()
			break
		}
	}
	if groups.err != nil {
		return nil, groups.err
	}
	if groups.list != nil {
		out.Groups = groups.list
	}
	return out, nil
}

// bandWindow is a bands query's columns: the events before it (up to seq0)
// make its starting state, the events seq0+1..seqEnd fall in its columns.
type bandWindow struct {
	w            int
	seq0, seqEnd int64
	colOf        func(e *gpu.Event) int
	colOfSeq     func(seq int64) int // the column of an event known by its seq alone (a checkpoint's)
}

// columns finds the events of q's window and how they fall in columns.
func (r *reader) columns(q BandsQuery) (*bandWindow, error) {
	w := &bandWindow{w: q.W}
	if q.Events {
		s0, s1, err := r.eventWindow(q.T0, q.T1, q.W)
		if err != nil {
			return nil, err
		}
		width := float64(q.T1-q.T0) / float64(q.W)
		w.seq0, w.seqEnd = s0-1, s1-1
		w.colOfSeq = func(seq int64) int { return min(q.W-1, max(0, int(math.Floor(float64(seq-q.T0)/width)))) }
		w.colOf = func(e *gpu.Event) int { return w.colOfSeq(e.Seq) }
		return w, nil
	}
	dt := float64(q.T1-q.T0) / float64(q.W)
	colOfT := func(t int64) int { return min(q.W-1, max(0, int(math.Floor(float64(t-q.T0)/dt)))) }
	var err error
	if w.seq0, _, _, err = r.stateAt(q.T0, false); err != nil {
		return nil, err
	}
	if w.seqEnd, _, _, err = r.stateAt(q.T1, true); err != nil {
		return nil, err
	}
	w.colOf = func(e *gpu.Event) int { return colOfT(e.TimeUS) }
	w.colOfSeq = func(seq int64) int {
		t, err := r.timeOf(seq)
		if err != nil {
			return 0
		}
		return colOfT(t)
	}
	return w, nil
}

// colPeak is where a column is sampled: right after event seq, its
// greatest allocated bytes; seq -2 for a column without events. end is
// the column's last event.
type colPeak struct {
	seq, end int64
	bytes    uint64
}

// peaks finds each column's peak, and fills out's envelope and greatest
// reserved bytes, in one pass over the window's events.
func (r *reader) peaks(win *bandWindow, out *Bands) ([]colPeak, error) {
	t, err := r.totalsAfter(win.seq0)
	if err != nil {
		return nil, err
	}
	peaks := make([]colPeak, win.w)
	for i := range peaks {
		peaks[i].seq = -2
	}
	out.YMax = t.Reserved
	last := -1 // the last column reached
	err = r.eventsTotals(win.seq0+1, win.seqEnd+1, func(e *gpu.Event, _ bool, at gpu.Totals) bool {
		c := win.colOf(e)
		for ; last < c; last++ {
			out.Allocated[last+1] = t.Allocated // columns passed keep the state they are in
		}
		if p := &peaks[c]; p.seq == -2 || at.Allocated > p.bytes {
			p.seq, p.bytes = e.Seq, at.Allocated
			out.Allocated[c] = at.Allocated
		}
		peaks[c].end = e.Seq
		out.YMax = max(out.YMax, at.Reserved)
		t = at
		return true
	})
	for ; last < win.w-1; last++ {
		out.Allocated[last+1] = t.Allocated
	}
	return peaks, err
}

// PeakSeqs is where each of the n columns of a window (q's T0, T1 and
// Events; W is n) is sampled: right after the event of its peak of
// allocated bytes, or for a column without events the last event before
// it (-1: none). A window of more than maxSweep events is sampled at its
// columns' middles instead.
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
	out := make([]int64, q.W)
	if win.seqEnd-win.seq0 > maxSweep {
		for c := range out {
			mid := q.T0 + int64((float64(c)+0.5)*float64(q.T1-q.T0)/float64(q.W))
			if q.Events {
				out[c] = min(mid, win.seqEnd)
			} else if out[c], _, _, err = r.stateAt(mid, true); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	peaks, err := r.peaks(win, &Bands{Allocated: make([]uint64, q.W)})
	if err != nil {
		return nil, err
	}
	carry := win.seq0
	for c, p := range peaks {
		if p.seq == -2 {
			out[c] = carry
			continue
		}
		out[c], carry = p.seq, p.end
	}
	return out, nil
}

// envelope fills out's envelope and greatest reserved bytes for a dense
// window, from the usage answer of its columns.
func (r *reader) envelope(db *DB, id string, q BandsQuery, out *Bands) error {
	if q.Events {
		u, err := usageByEvent(r, q.T0, q.T1, q.W)
		if err != nil {
			return err
		}
		for c := range q.W {
			k := min(c*len(u.Events)/q.W, len(u.Events)-1)
			out.Allocated[c] = u.Allocated[2*k+1]
			out.YMax = max(out.YMax, u.Reserved[2*k+1])
		}
		return nil
	}
	u, err := db.Usage(id, q.T0, q.T1, q.W)
	if err != nil {
		return err
	}
	dt := float64(q.T1-q.T0) / float64(q.W)
	colOf := func(t int64) int { return min(q.W-1, max(0, int(math.Floor(float64(t-q.T0)/dt)))) }
	for _, b := range u.Buckets {
		out.YMax = max(out.YMax, b.Reserved.Max)
		for c := colOf(b.StartUS); c <= colOf(b.StartUS+u.BucketUS-1); c++ {
			out.Allocated[c] = max(out.Allocated[c], b.Allocated.Max)
		}
	}
	return nil
}

// sweep replays the window's events from checkpoint ck, sampling each
// column right after its peak, and a stretch of columns without events at
// its first and last column (the state is the same across it: the one
// after the column before it).
func (r *reader) sweep(live *liveSet, lay *bandLayout, ck int64, win *bandWindow, peaks []colPeak) error {
	type at struct {
		seq int64 // sample right after this event
		col int
	}
	var plan []at
	for c := 0; c < len(peaks); {
		if peaks[c].seq != -2 {
			plan = append(plan, at{peaks[c].seq, c})
			c++
			continue
		}
		after := win.seq0
		if c > 0 {
			after = peaks[c-1].end
		}
		end := c
		for end+1 < len(peaks) && peaks[end+1].seq == -2 {
			end++
		}
		plan = append(plan, at{after, c}, at{after, end})
		c = end + 1
	}
	sort.SliceStable(plan, func(i, j int) bool { return plan[i].seq < plan[j].seq })
	next := 0
	take := func(upTo int64) {
		for ; next < len(plan) && plan[next].seq <= upTo; next++ {
			lay.sample(live, plan[next].col)
		}
	}
	if win.seq0 <= ck || win.seq0 < 0 { // the checkpoint is the state the window starts in
		take(win.seq0)
	}
	err := r.eventsWithEnds(ck+1, win.seqEnd+1, func(e *gpu.Event, ends bool) bool {
		live.apply(e, ends)
		if next < len(plan) && plan[next].seq == e.Seq {
			take(e.Seq)
		}
		return true
	})
	if err == nil && next < len(plan) {
		err = fmt.Errorf("trace %s: the window's events end before its samples", r.trace.ID)
	}
	return err
}

// sampleCheckpoints samples a dense window: the state at its start for the
// columns before the first checkpoint, then each checkpoint's state for the
// columns from its own to the next one's.
func (r *reader) sampleCheckpoints(live *liveSet, lay *bandLayout, ck, seq0, seqEnd int64, colOf func(int64) int) error {
	err := r.eventsWithEnds(ck+1, seq0+1, func(e *gpu.Event, ends bool) bool { live.apply(e, ends); return true })
	if err != nil {
		return err
	}
	// The checkpoints in the window, thinned to maxSamples, and the last
	// of each column.
	var seqs []int64
	rows, err := r.tx.Query("SELECT seq FROM checkpoints WHERE tid = ? AND seq > ? AND seq <= ? ORDER BY seq", r.tid, seq0, seqEnd)
	if err != nil {
		return err
	}
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return err
		}
		seqs = append(seqs, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	step := max(1, (len(seqs)+maxSamples-1)/maxSamples)
	type sample struct {
		seq int64
		col int
	}
	var picks []sample
	for i := step - 1; i < len(seqs); i += step {
		s := sample{seqs[i], colOf(seqs[i])}
		if s.col == 0 {
			continue // column 0 is sampled at the window's start
		}
		if n := len(picks); n > 0 && picks[n-1].col == s.col {
			picks[n-1] = s
		} else {
			picks = append(picks, s)
		}
	}
	lay.sample(live, 0) // the window's start
	lay.out.Samples = len(picks) + 1
	if len(picks) == 0 {
		return nil
	}
	// One checkpoint at a time, no rows left open while a sample reads
	// more (a fold's group reads its stack: PostgreSQL cannot query while
	// a query's rows are still coming).
	for _, p := range picks {
		var data []byte
		err := r.tx.QueryRow("SELECT data FROM checkpoints WHERE tid = ? AND seq = ?", r.tid, p.seq).Scan(&data)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("trace %s: checkpoint %d is missing", r.trace.ID, p.seq)
		}
		if err != nil {
			return err
		}
		if err := lay.load(live, data); err != nil {
			return fmt.Errorf("trace %s: checkpoint %d: %w", r.trace.ID, p.seq, err)
		}
		lay.sample(live, p.col)
	}
	return nil
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

// bandKey names an allocation: its seq, or for one made before the trace
// (seq -1) its address with the top bit set.
type bandKey uint64

func keyOf(e *liveEntry) bandKey {
	if e.seq < 0 {
		return bandKey(1<<63 | e.addr)
	}
	return bandKey(e.seq)
}

// bottom is the bandKey of the gap below every band.
const bottom = bandKey(math.MaxUint64)

// bandLayout turns samples of the live set into bands and folds.
type bandLayout struct {
	out      *Bands
	minBytes uint64 // the least size of a band of its own
	row      uint64 // a pixel row: what a fold reaches before another group may start
	quantum  uint64 // a quarter of a pixel row
	bands    []Band
	bandOf   map[bandKey]int32
	runs     int
	groups   *foldGroups
	samples  []foldSample
	pend     piece // the fold being gathered
}

// piece is a folded band in one sample: the gap it lies in (the band
// below it) and its place there, its bytes, and the bytes of each group
// in it.
type piece struct {
	gap    bandKey
	ord    int
	off    uint64
	size   uint64
	count  int
	rep    liveEntry
	groups []groupBytes
}

type groupBytes struct {
	group uint32
	bytes uint64
}

// group is the group holding most of p's bytes (the first of them on a tie).
func (p *piece) group() uint32 {
	best := p.groups[0]
	for _, g := range p.groups[1:] {
		if g.bytes > best.bytes {
			best = g
		}
	}
	return best.group
}

func (p *piece) add(e *liveEntry, g uint32) {
	if p.count == 0 || e.size > p.rep.size {
		p.rep = *e
	}
	p.count++
	p.size += e.size
	for i := range p.groups {
		if p.groups[i].group == g {
			p.groups[i].bytes += e.size
			return
		}
	}
	p.groups = append(p.groups, groupBytes{g, e.size})
}

// foldSample is the folds of the sample of one column.
type foldSample struct {
	col    int
	pieces []piece
}

// sample records the stack of live at column c, sampled after the column
// sampled last. A band in both samples spans the columns between them at
// its offset in the later one: offsets only fall while an allocation lives
// (the allocations below it can only go), so the band never rises above
// where it really is, nor above the allocated envelope. A band not in the
// earlier sample starts at c. The folds are kept for foldRuns.
func (l *bandLayout) sample(live *liveSet, c int) {
	m0, m1 := l.out.M0, l.out.M1
	fs := foldSample{col: c}
	var off uint64
	gap, ord := bottom, 0
	flush := func() {
		if p := &l.pend; p.count > 0 {
			if p.off < m1 && p.off+p.size > m0 {
				p.gap, p.ord = gap, ord
				fs.pieces = append(fs.pieces, *p)
			}
			ord++
			*p = piece{groups: p.groups[:0:0]}
		}
	}
	for i := range live.list {
		e := &live.list[i]
		if e.size == 0 {
			continue
		}
		if e.size < l.minBytes {
			g := l.groups.of(e.stack)
			if p := &l.pend; p.count == 0 {
				p.off = off
			} else if p.size >= l.row && g != p.group() {
				flush()
				l.pend.off = off
			}
			l.pend.add(e, g)
			off += e.size
			continue
		}
		flush()
		gap, ord = keyOf(e), 0
		if e.band < 0 && off < m1 && off+e.size > m0 {
			e.band = int32(len(l.bands))
			l.bandOf[keyOf(e)] = e.band
			l.bands = append(l.bands, Band{Seq: e.seq, Addr: e.addr, Size: e.size, Requested: e.requested, Stack: e.stack, C0: c, C1: c})
			l.bands[e.band].Runs = append(l.bands[e.band].Runs, int64(c), int64(off))
			l.runs++
		} else if e.band >= 0 {
			b := &l.bands[e.band]
			if n := len(b.Runs); absDiff(uint64(b.Runs[n-1]), off) >= l.quantum {
				b.Runs = append(b.Runs, int64(b.C1+1), int64(off))
				l.runs++
			}
			b.C1 = c
		}
		off += e.size
	}
	flush()
	l.samples = append(l.samples, fs)
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// finish keeps the largest bands within the caps, and lays the folds out
// in runs.
func (l *bandLayout) finish() {
	bands := l.bands
	if len(bands) > maxBands || l.runs > maxRuns {
		bySize := make([]int, len(bands))
		for i := range bySize {
			bySize[i] = i
		}
		sort.SliceStable(bySize, func(i, j int) bool { return bands[bySize[i]].Size > bands[bySize[j]].Size })
		keep := make([]bool, len(bands))
		runs := 0
		for n, i := range bySize {
			if n >= maxBands || runs+len(bands[i].Runs)/2 > maxRuns {
				break
			}
			keep[i] = true
			runs += len(bands[i].Runs) / 2
		}
		kept := bands[:0:0]
		for i := range bands {
			if keep[i] {
				kept = append(kept, bands[i])
			}
		}
		l.out.Dropped = len(bands) - len(kept)
		bands = kept
	}
	if bands != nil {
		l.out.Bands = bands
	}
	for {
		l.out.Folds = l.foldRuns()
		if len(l.out.Folds) <= maxFoldRuns || !l.mergeFolds() {
			break
		}
	}
}

// foldRuns lays the samples' folds out in runs: a fold keeps its run from
// one sample to the next while it stays in its place (gap and order),
// group, offset and size (within a quarter of a pixel row).
func (l *bandLayout) foldRuns() []Fold {
	type place struct {
		gap bandKey
		ord int
	}
	out := []Fold{}
	open := map[place]int{} // the run of each place in the last sample
	prev := -1
	for _, s := range l.samples {
		next := make(map[place]int, len(s.pieces))
		for i := range s.pieces {
			p := &s.pieces[i]
			k, g := place{p.gap, p.ord}, p.group()
			if j, ok := open[k]; ok {
				f := &out[j]
				if f.C1 == prev && f.Group == g && absDiff(f.Offset, p.off) < l.quantum && absDiff(f.Size, p.size) < l.quantum {
					f.C1 = s.col
					next[k] = j
					continue
				}
			}
			next[k] = len(out)
			out = append(out, Fold{C0: s.col, C1: s.col, Offset: p.off, Size: p.size, Group: g, Count: p.count,
				Rep: Band{Seq: p.rep.seq, Addr: p.rep.addr, Size: p.rep.size, Requested: p.rep.requested, Stack: p.rep.stack}})
		}
		open, prev = next, s.col
	}
	return out
}

// mergeFolds merges the folds of each sample pairwise within their gaps;
// false when no sample has two folds in a gap left.
func (l *bandLayout) mergeFolds() bool {
	merged := false
	for si := range l.samples {
		ps := l.samples[si].pieces
		kept := ps[:0]
		for i := 0; i < len(ps); i++ {
			p := ps[i]
			if i+1 < len(ps) && ps[i+1].gap == p.gap {
				q := ps[i+1]
				if q.rep.size > p.rep.size {
					p.rep = q.rep
				}
				p.size = q.off + q.size - p.off
				p.count += q.count
				p.groups = slices.Clone(p.groups)
				for _, g := range q.groups {
					if k := slices.IndexFunc(p.groups, func(x groupBytes) bool { return x.group == g.group }); k >= 0 {
						p.groups[k].bytes += g.bytes
					} else {
						p.groups = append(p.groups, g)
					}
				}
				i++
				merged = true
			}
			p.ord = len(kept)
			kept = append(kept, p)
		}
		l.samples[si].pieces = kept
	}
	return merged
}

// foldGroups numbers the groups of folded allocations, reading each
// stack's label once per trace (DB.labels keeps them).
type foldGroups struct {
	db    *DB
	r     *reader
	by    FoldBy
	bySID map[gpu.StackID]uint32
	names map[string]uint32
	list  []string
	err   error
}

// of is the group of the allocations of stack sid.
func (g *foldGroups) of(sid gpu.StackID) uint32 {
	if i, ok := g.bySID[sid]; ok {
		return i
	}
	name := ""
	if sid != 0 {
		name = g.db.stackLabel(g.r, sid, &g.err)
	}
	key := name
	if g.by == FoldByStack {
		key = fmt.Sprint(sid)
	}
	i, ok := g.names[key]
	if !ok {
		i = uint32(len(g.list))
		g.names[key] = i
		g.list = append(g.list, name)
	}
	g.bySID[sid] = i
	return i
}
