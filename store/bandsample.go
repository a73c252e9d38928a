package store

import (
	"cmp"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"vramscope/gpu"
)

// Where the stacked timeline's columns are sampled, at a cost that
// follows the pixels. A window of at most sweepPerColumn events per
// column is swept: its events are replayed once through the live set,
// which keeps the allocations freed in the current column until the
// column's sample is taken at its peak, once its last event is known.
//
// A denser window has fewer, wider columns, as many as the same budget of
// events replays when each is sampled on its own: its peak is found in
// the usage pyramid (a usage bucket of at most leafEvents events holding
// the column's greatest allocated bytes, found by descending from the
// buckets that cover the column), and the live set there is the nearest
// checkpoint before it plus the events up to the bucket's peak. Each
// column of either kind is so drawn at the top of its envelope, which
// is that sample's allocated bytes.

// sweepPerColumn is the most events per pixel column a bands answer
// replays (a variable for tests).
var sweepPerColumn int64 = 250

// peakSweepPerColumn is the most events per column PeakSeqs reads: its
// columns need no live set, so a chunk of events each costs about what
// finding a dense column's peak does (a variable for tests).
var peakSweepPerColumn int64 = 2 * chunkSize

const (
	// leafEvents is the most events of the usage bucket a dense column's
	// peak is searched in.
	leafEvents = 256
)

// sweep replays the window's events once, from the checkpoint before it,
// sampling each column right after its peak, and a stretch of columns
// without events at its first and last column (the state is the same
// across it: the one its events left). It fills out's envelope.
func (r *reader) sweep(live *liveSet, lay *bandLayout, win *bandWindow) error {
	ck, err := r.liveAtCheckpoint(win.seq0, live, lay)
	if err != nil {
		return err
	}
	s := &eventStream{r: r, end: win.seqEnd}
	s.seek(ck + 1)
	for s.peek() && s.ev.Seq <= win.seq0 { // the state the window starts in
		live.apply(&s.ev, s.ends)
		s.take()
	}
	if s.err != nil {
		return s.err
	}
	now := s.before // the totals after the events applied
	if !s.ready {   // no event from the checkpoint on: s read none
		if now, err = r.totalsAfter(win.seq0); err != nil {
			return err
		}
	}
	allocated := lay.out.Allocated
	applied := win.seq0       // the last event applied
	cur, peak := -1, int64(0) // the column of the events, where it peaks
	// finish samples column cur at its peak, and the columns without
	// events after it up to column c at the state they are in.
	finish := func(c int) {
		if cur >= 0 {
			lay.sample(live, cur, peak)
		}
		if first := cur + 1; first < c {
			lay.sample(live, first, applied)
			if last := c - 1; last > first {
				lay.sample(live, last, applied)
			}
			for i := first; i < c; i++ {
				allocated[i] = now.Allocated
			}
		}
		live.compact()
	}
	next := int64(math.MinInt64) // the least key of the column after cur
	for s.peek() {
		e := &s.ev
		if k := win.key(e); k >= next {
			c := win.col(k)
			finish(c)
			cur, peak, next = c, e.Seq, win.start(c+1)
			allocated[c] = s.after.Allocated
		} else if s.after.Allocated > allocated[cur] {
			peak, allocated[cur] = e.Seq, s.after.Allocated
		}
		live.apply(e, s.ends)
		applied, now = e.Seq, s.after
		s.take()
	}
	if s.err != nil {
		return s.err
	}
	finish(win.w)
	return nil
}

// densePlan is a dense window's columns: where each one peaks, and what
// finding its events needs.
type densePlan struct {
	colAxis
	spans []timeSpan // per column, its times
	// leaves holds, per column, the times of the usage bucket holding its
	// peak (lo > hi: not known).
	leaves []timeSpan
	// firstSeq bounds each column's first event from below.
	firstSeq []int64
	// The window's chunks (their first seqs and times) and checkpoints,
	// to start each column's replay from the latest checkpoint before it.
	chunkSeq, chunkUS []int64
	checkpoints       []int64
}

// end is where the plan's columns end (their t0 and w columns of width).
func (p *densePlan) end() int64 { return p.t0 + int64(math.Round(float64(p.w)*p.width)) }

// timeSpan is the times [lo, hi].
type timeSpan struct{ lo, hi int64 }

// planDense lays out w columns of a dense window (w == 0: as many as the
// budget affords when each is replayed from a checkpoint), and finds
// where each one peaks. With w == 0 on the time axis, the columns are the
// usage buckets of a level (the window widened to whole ones: win
// changes), so that the usage pyramid says exactly where each peaks.
func (r *reader) planDense(q BandsQuery, win *bandWindow, w int) (*densePlan, error) {
	p := &densePlan{}
	aligned := w == 0 && !q.Events
	ck, err := r.latestCheckpoint(win.seq0)
	if err != nil {
		return nil, err
	}
	if p.checkpoints, err = r.int64s("SELECT seq FROM checkpoints WHERE tid = ? AND seq >= ? AND seq <= ? ORDER BY seq", r.tid, ck, win.seqEnd); err != nil {
		return nil, err
	}
	if w == 0 {
		// A column costs its replay from a checkpoint, half their spacing
		// on average, and its leaf's.
		spacing := max(checkpointEvery, (win.seqEnd-max(ck, win.seq0))/int64(len(p.checkpoints)))
		w = int(max(1, min(int64(q.W), sweepPerColumn*int64(q.W)/(spacing/2+leafEvents))))
	}
	p.colAxis = colAxis{events: q.Events, t0: q.T0, width: float64(q.T1-q.T0) / float64(w), w: w}
	if aligned {
		k := 0
		for int64(w)<<k < q.T1-q.T0+1 {
			k++
		}
		t0 := q.T0 >> k << k
		p.colAxis = colAxis{t0: t0, width: float64(int64(1) << k), w: int(q.T1>>k - q.T0>>k + 1)}
		if win.seq0, _, _, err = r.stateAt(t0, false); err != nil {
			return nil, err
		}
		if win.seqEnd, _, _, err = r.stateAt(p.end()-1, true); err != nil {
			return nil, err
		}
		if ck, err = r.latestCheckpoint(win.seq0); err != nil {
			return nil, err
		}
		if p.checkpoints, err = r.int64s("SELECT seq FROM checkpoints WHERE tid = ? AND seq >= ? AND seq <= ? ORDER BY seq", r.tid, ck, win.seqEnd); err != nil {
			return nil, err
		}
	}
	rows, err := r.tx.Query("SELECT first_seq, first_us FROM chunks WHERE tid = ? AND first_seq <= ? AND last_seq > ? ORDER BY first_seq", r.tid, win.seqEnd, ck)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var s, t int64
		if err := rows.Scan(&s, &t); err != nil {
			rows.Close()
			return nil, err
		}
		p.chunkSeq, p.chunkUS = append(p.chunkSeq, s), append(p.chunkUS, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Each column's times, and on the event axis its first event.
	p.spans = make([]timeSpan, p.w)
	p.firstSeq = make([]int64, p.w)
	switch {
	case q.Events:
		bounds := make([]int64, p.w+1) // each column's first event, then the window's last
		for c := range p.w {
			bounds[c] = max(win.seq0+1, p.start(c))
			p.firstSeq[c] = bounds[c]
		}
		bounds[p.w] = win.seqEnd
		times, err := r.timesFrom(bounds, p.chunkSeq)
		if err != nil {
			return nil, err
		}
		for c := range p.w {
			p.spans[c] = timeSpan{times[c], times[c+1]}
		}
	case aligned:
		for c := range p.w {
			lo := p.t0 + int64(c)*int64(p.width)
			p.spans[c], p.firstSeq[c] = timeSpan{lo, lo + int64(p.width) - 1}, win.seq0+1
		}
	default:
		for c := range p.w {
			p.spans[c] = timeSpan{max(q.T0, p.start(c)), min(q.T1, p.start(c+1)-1)}
			p.firstSeq[c] = win.seq0 + 1
		}
	}
	found, err := r.peakLeaves(p.spans, q.Events)
	if err != nil {
		return nil, err
	}
	// Each column's leaf: the exact one, unless the events of a bound
	// that passes it go higher.
	p.leaves = make([]timeSpan, p.w)
	s := &eventStream{r: r, end: win.seqEnd}
	for c, ls := range found {
		p.leaves[c] = timeSpan{1, 0}
		var best uint64
		for i, l := range ls {
			if l.exact {
				p.leaves[c], best = l.timeSpan, l.max
				continue
			}
			if i > 0 && l.max <= best {
				break
			}
			if m, ok := p.maxIn(s, c, l.timeSpan); ok && (p.leaves[c].lo > p.leaves[c].hi || m > best) {
				p.leaves[c], best = l.timeSpan, m
			}
			if s.err != nil {
				return nil, s.err
			}
		}
	}
	return p, nil
}

// maxIn is the greatest allocated bytes after an event of column c in
// the times l, read from the chunks that hold them (their totals need no
// checkpoint); false where none of the column's events is there.
func (p *densePlan) maxIn(s *eventStream, c int, l timeSpan) (uint64, bool) {
	if len(p.chunkSeq) == 0 {
		return 0, false
	}
	i := max(0, sort.Search(len(p.chunkUS), func(i int) bool { return p.chunkUS[i] >= l.lo })-1)
	s.seekChunk(p.chunkSeq[i], p.chunkSeq[i], 2)
	var best uint64
	found := false
	for s.peek() && s.ev.TimeUS <= l.hi {
		if s.ev.TimeUS >= l.lo && p.colOf(&s.ev) == c && (!found || s.after.Allocated > best) {
			best, found = s.after.Allocated, true
		}
		s.take()
	}
	return best, found
}

// from is the first event column c's replay needs: its first, or the
// first of the last chunk to begin before its leaf (or its times).
func (p *densePlan) from(c int) int64 {
	lo := p.spans[c].lo
	if p.leaves[c].lo <= p.leaves[c].hi {
		lo = p.leaves[c].lo
	}
	from := p.firstSeq[c]
	if i := sort.Search(len(p.chunkUS), func(i int) bool { return p.chunkUS[i] >= lo }) - 1; i >= 0 {
		from = max(from, p.chunkSeq[i])
	}
	return from
}

// peak replays column c's events from s up to its leaf's end, taking
// each (apply sees it), and returns the one after which allocated bytes
// are greatest among those in the leaf: its seq and bytes; found is false
// where the column has none. Where the leaf holds none of the column's
// events (not known, or a guess the column's bounds cut), the first past
// it stands for them.
func (p *densePlan) peak(c int, s *eventStream, apply func(e *gpu.Event, ends bool)) (seq int64, bytes uint64, found bool) {
	leaf := p.leaves[c]
	known := leaf.lo <= leaf.hi
	for s.peek() {
		e := &s.ev
		ec := p.colOf(e)
		if ec > c || known && found && e.TimeUS > leaf.hi {
			break
		}
		if ec == c && (!known || e.TimeUS >= leaf.lo) && (!found || s.after.Allocated > bytes) {
			seq, bytes, found = e.Seq, s.after.Allocated, true
		}
		apply(e, s.ends)
		s.take()
	}
	return seq, bytes, found
}

// sampleDense samples each column of a dense window at its peak (see
// densePlan.peak), replayed from the state the last column's sample left
// or from the latest checkpoint before the events it needs, whichever is
// later; a column without events in the state it is in.
func (r *reader) sampleDense(live *liveSet, lay *bandLayout, p *densePlan, win *bandWindow) error {
	s := &eventStream{r: r, end: win.seqEnd}
	applied := int64(math.MinInt64) // the last event applied
	var now gpu.Totals              // the totals after it
	apply := func(e *gpu.Event, ends bool) {
		live.apply(e, ends)
		applied, now = e.Seq, s.after
	}
	for c := range p.w {
		from := p.from(c)
		if i := sort.Search(len(p.checkpoints), func(i int) bool { return p.checkpoints[i] >= from }) - 1; i >= 0 && p.checkpoints[i] > applied {
			ck := p.checkpoints[i]
			if err := r.loadCheckpoint(ck, live, lay); err != nil {
				return err
			}
			// The chunks from the one holding ck+1 to the one where the
			// leaf ends, read at once.
			i := max(0, sort.Search(len(p.chunkSeq), func(i int) bool { return p.chunkSeq[i] > ck+1 })-1)
			end := p.spans[c].hi
			if p.leaves[c].lo <= p.leaves[c].hi {
				end = p.leaves[c].hi
			}
			j := sort.Search(len(p.chunkUS), func(j int) bool { return p.chunkUS[j] > end })
			if len(p.chunkSeq) > 0 && p.chunkSeq[i] <= ck+1 {
				s.seekChunk(ck+1, p.chunkSeq[i], j-i)
			} else {
				s.seek(ck + 1)
			}
			applied = ck
			if s.peek() {
				now = s.before
			} else if s.err != nil {
				return s.err
			} else if t, err := r.totalsAfter(ck); err != nil {
				return err
			} else {
				now = t
			}
		} else if applied == math.MinInt64 {
			return fmt.Errorf("trace %s: no layout checkpoint before event %d", r.trace.ID, from)
		}
		seq, bytes, found := p.peak(c, s, apply)
		if s.err != nil {
			return s.err
		}
		if !found {
			seq, bytes = applied, now.Allocated
		}
		lay.out.Allocated[c] = bytes
		lay.sample(live, c, seq)
		live.compact()
	}
	lay.out.Samples = p.w
	return nil
}

// densePeaks is PeakSeqs of a dense window: each column's peak in its
// leaf, read from the chunks that hold it (their totals need no
// checkpoint); a column without events the last event before it.
func (r *reader) densePeaks(p *densePlan, win *bandWindow) ([]int64, error) {
	out := make([]int64, p.w)
	s := &eventStream{r: r, end: win.seqEnd}
	last := win.seq0 // the last event taken (where the stream is, if at)
	at := false
	for c := range p.w {
		if from := p.from(c); !at || from > last+chunkSize {
			s.seek(from)
			at, last = true, from-1 // (the events between are not in the column: its first is at from or after)
		}
		seq, _, found := p.peak(c, s, func(e *gpu.Event, _ bool) { last = e.Seq })
		if s.err != nil {
			return nil, s.err
		}
		out[c] = seq
		if !found {
			out[c] = last
		}
	}
	return out, nil
}

// leafPeak is where the usage pyramid puts a span's peak: a usage
// bucket cut to the span, and its greatest allocated bytes after an event
// (exact: known to be in the span; else an upper bound).
type leafPeak struct {
	timeSpan
	max   uint64
	exact bool
}

// peakLeaves finds, for each span of time, the usage bucket of at most
// leafEvents events (or of level 0), cut to the span, that holds the
// span's greatest allocated bytes after an event: best first, down the
// usage pyramid from the few buckets that cover the span, a level at a
// time for all spans (a query per level). A bucket without a stored row
// has fewer than levelMinEvents events: within the span, where its
// sibling's greatest is below their parent's it holds the parent's, and
// where neither has a row the parent is the leaf; across the span's edge,
// its greatest is not known, only bounded by its parent's: such leaves
// (strict: every bucket holding an edge of the span, whose events may be
// another column's) come after the exact one, those whose bound passes
// its greatest. A span whose buckets have no rows (few events, or a live
// trace's last ones) gets none.
func (r *reader) peakLeaves(spans []timeSpan, strict bool) ([][]leafPeak, error) {
	type key struct {
		k int
		b int64
	}
	type bucket struct {
		key
		n      int64
		max    uint64
		known  bool // n and max are (max: exact, or a bound)
		up     bool // a first bucket without a row, whose parent was asked for
		bound  bool // max only bounds its events' greatest
		leaf   bool // no child to go down to
		parent *bucket
	}
	rows := map[key]*bucket{} // the rows read (nil: none)
	want := map[int][]any{}   // the buckets to read, by level
	ask := func(k key) {
		if _, asked := rows[k]; !asked {
			rows[k] = nil
			want[k.k] = append(want[k.k], k.b)
		}
	}
	read := func() error {
		for k, bs := range want {
			err := queryIn(r.tx, "SELECT b, n, alloc_max FROM usage_levels WHERE tid = ? AND k = ? AND b IN (%s)", []any{r.tid, k}, bs, func(rs *sql.Rows) error {
				var b, n, m int64
				if err := rs.Scan(&b, &n, &m); err != nil {
					return err
				}
				rows[key{k, b}] = &bucket{key: key{k, b}, n: n, max: uint64(m), known: true}
				return nil
			})
			if err != nil {
				return err
			}
		}
		clear(want)
		return nil
	}
	out := make([][]leafPeak, len(spans))
	cands := make([][]*bucket, len(spans)) // nil: done
	for i, sp := range spans {
		if sp.hi < sp.lo {
			continue
		}
		k := 0
		for k < numLevels-1 && sp.hi>>k-sp.lo>>k+1 > 4 {
			k++
		}
		for b := sp.lo >> k; b <= sp.hi>>k; b++ {
			cands[i] = append(cands[i], &bucket{key: key{k, b}})
			ask(key{k, b})
		}
	}
	overlaps := func(sp timeSpan, k key) bool { return k.b<<k.k <= sp.hi && (k.b+1)<<k.k-1 >= sp.lo }
	inside := func(sp timeSpan, k key) bool {
		lo, hi := k.b<<k.k, (k.b+1)<<k.k-1
		if strict {
			return lo > sp.lo && hi < sp.hi
		}
		return lo >= sp.lo && hi <= sp.hi
	}
	for more := true; more; {
		if err := read(); err != nil {
			return nil, err
		}
		more = false
		for i, sp := range spans {
			if cands[i] == nil {
				continue
			}
			// What the rows say of the candidates, and of those without
			// one what their parents and siblings do.
			kept := cands[i][:0]
			for _, c := range cands[i] {
				if row := rows[c.key]; !c.known && row != nil {
					c.n, c.max, c.known = row.n, row.max, true
				} else if !c.known {
					if c.parent == nil && !c.up { // a first bucket without a row: what its parent says
						c.up, more = true, true
						ask(key{c.k + 1, c.b >> 1})
						ask(key{c.k, c.b ^ 1})
						kept = append(kept, c)
						continue
					}
					if c.parent == nil {
						if c.parent = rows[key{c.k + 1, c.b >> 1}]; c.parent == nil {
							// Too few events around to say: a bound
							// that only reading them settles.
							c.n, c.max, c.known, c.bound, c.leaf = 0, math.MaxUint64, true, true, true
							kept = append(kept, c)
							continue
						}
					}
					sk := key{c.k, c.b ^ 1}
					switch sib := rows[sk]; {
					case sib == nil && c.b&1 == 1 && overlaps(sp, sk):
						continue // the parent stands for both (below)
					case sib == nil: // neither child has a row: the parent is the leaf
						*c = bucket{key: c.parent.key, n: c.parent.n, max: c.parent.max, known: true, bound: c.parent.bound, leaf: true}
					case sib.max < c.parent.max: // the parent's greatest is in it
						c.n, c.max, c.known, c.bound, c.leaf = c.parent.n-sib.n, c.parent.max, true, c.parent.bound, true
					case overlaps(sp, sk):
						continue // its sibling holds the parent's greatest
					default: // its sibling, outside the span, holds it: only bounded
						c.n, c.max, c.known, c.bound, c.leaf = c.parent.n-sib.n, c.parent.max, true, true, true
					}
				}
				kept = append(kept, c)
			}
			cands[i] = kept
			var best *bucket
			pending := false
			for _, c := range kept {
				pending = pending || !c.known
				if c.known && (best == nil || c.max > best.max) {
					best = c
				}
			}
			if pending {
				continue // next round, with their parents read
			}
			if best == nil {
				cands[i] = nil
				continue
			}
			lo, hi := best.b<<best.k, (best.b+1)<<best.k-1
			cut := timeSpan{max(lo, sp.lo), min(hi, sp.hi)}
			in := inside(sp, best.key) && !best.bound
			if in && (best.leaf || best.k == 0 || best.n <= leafEvents) {
				out[i], cands[i] = append(out[i], leafPeak{cut, best.max, true}), nil
				continue
			}
			rest := make([]*bucket, 0, len(kept)+1)
			for _, c := range kept {
				if c != best {
					rest = append(rest, c)
				}
			}
			if best.leaf || best.k == 0 {
				// Across the edge and no deeper: its greatest is a bound.
				out[i] = append(out[i], leafPeak{cut, best.max, false})
			} else {
				// Down a level: best's children within the span (their
				// siblings outside it read all the same, for what they
				// say).
				for _, b := range []int64{2 * best.b, 2*best.b + 1} {
					k := key{best.k - 1, b}
					ask(k)
					if overlaps(sp, k) {
						rest = append(rest, &bucket{key: k, parent: best})
					}
				}
			}
			if len(rest) == 0 {
				rest = nil
			}
			cands[i], more = rest, true
		}
	}
	// The exact leaf first, then the bounds that pass it, greatest first.
	for i, ls := range out {
		exact := slices.IndexFunc(ls, func(l leafPeak) bool { return l.exact })
		var floor uint64
		if exact >= 0 {
			floor = ls[exact].max
		}
		kept := make([]leafPeak, 0, len(ls))
		if exact >= 0 {
			kept = append(kept, ls[exact])
		}
		for _, l := range ls {
			if !l.exact && (exact < 0 || l.max > floor) {
				kept = append(kept, l)
			}
		}
		bounds := kept
		if exact >= 0 {
			bounds = kept[1:]
		}
		slices.SortStableFunc(bounds, func(a, b leafPeak) int { return cmp.Compare(b.max, a.max) })
		out[i] = kept
	}
	return out, nil
}

// timesFrom is the time of the first event at or after each of seqs
// (ascending), or of the trace's last event past it. chunkSeq, where
// given, is the first seqs of the chunks that hold them, in order.
func (r *reader) timesFrom(seqs, chunkSeq []int64) ([]int64, error) {
	out := make([]int64, len(seqs))
	s := &eventStream{r: r, end: r.trace.LastSeq}
	for i, seq := range seqs {
		if s.page == nil && !s.done || s.ready && seq-s.ev.Seq > chunkSize {
			// Seek rather than decode the chunks between.
			if j := sort.Search(len(chunkSeq), func(j int) bool { return chunkSeq[j] > seq }) - 1; j >= 0 {
				s.seekChunk(seq, chunkSeq[j], 1)
			} else {
				s.seek(seq)
			}
		}
		for s.peek() && s.ev.Seq < seq {
			s.take()
		}
		if s.err != nil {
			return nil, s.err
		}
		out[i] = r.trace.LastUS
		if s.ready {
			out[i] = s.ev.TimeUS
		}
	}
	return out, nil
}

// latestCheckpoint is the seq of the latest checkpoint at or before seq.
func (r *reader) latestCheckpoint(seq int64) (int64, error) {
	var ck int64
	err := r.tx.QueryRow("SELECT seq FROM checkpoints WHERE tid = ? AND seq <= ? ORDER BY seq DESC LIMIT 1", r.tid, seq).Scan(&ck)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("trace %s: no layout checkpoint at or before %d", r.trace.ID, seq)
	}
	return ck, err
}

// int64s is the one column of int64s a query gives.
func (r *reader) int64s(q string, args ...any) ([]int64, error) {
	rows, err := r.tx.Query(q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// loadCheckpoint fills live with the allocations of checkpoint seq.
func (r *reader) loadCheckpoint(seq int64, live *liveSet, lay *bandLayout) error {
	var data []byte
	err := r.tx.QueryRow("SELECT data FROM checkpoints WHERE tid = ? AND seq = ?", r.tid, seq).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("trace %s: checkpoint %d is missing", r.trace.ID, seq)
	}
	if err != nil {
		return err
	}
	if err := lay.load(live, data); err != nil {
		return fmt.Errorf("trace %s: checkpoint %d: %w", r.trace.ID, seq, err)
	}
	return nil
}
