package store

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"vramscope/gpu"
)

// columnPeaks is the reference of a window's columns at their peaks: for
// each column the greatest allocated bytes after one of its events, and
// the stacks right after each event where it stands so (ties: events that
// leave the same bytes); for a column without events, the bytes and the
// stack after every event before it. colOf gives an event's column, -1
// before the window, w after it; before and after are ref.totals().
func columnPeaks(ref *reference, before gpu.Totals, after []gpu.Totals, w int, colOf func(e gpu.Event) int) ([]uint64, [][][]stacked) {
	best := make([]uint64, w)
	seen := make([]bool, w)
	for i, e := range ref.evs {
		if c := colOf(e); c >= 0 && c < w && (!seen[c] || after[i].Allocated > best[c]) {
			best[c], seen[c] = after[i].Allocated, true
		}
	}
	// Where each column is taken: after its events at its peak, or for a
	// column without events after the last event before it.
	at := map[int][]int{} // event index (-1: before the first) -> columns
	last := -1
	next := 0 // the first column not reached yet
	for i, e := range ref.evs {
		c := colOf(e)
		if c >= w {
			break
		}
		for ; next < c; next++ {
			if !seen[next] {
				at[last] = append(at[last], next)
			}
		}
		if c >= 0 {
			next = max(next, c)
			if after[i].Allocated == best[c] {
				at[i] = append(at[i], c)
			}
		}
		last = i
	}
	for ; next < w; next++ {
		if !seen[next] {
			at[last] = append(at[last], next)
		}
	}
	stacks := make([][][]stacked, w)
	l := ref.initial.Clone()
	take := func(cols []int) {
		if len(cols) == 0 {
			return
		}
		st := stackOf(l)
		for _, c := range cols {
			stacks[c] = append(stacks[c], st)
		}
	}
	for c := range w {
		if !seen[c] {
			best[c] = before.Allocated
		}
	}
	take(at[-1])
	for i, e := range ref.evs {
		if err := l.Apply(e); err != nil {
			panic(err)
		}
		take(at[i])
		for _, c := range at[i] {
			if !seen[c] {
				best[c] = after[i].Allocated
			}
		}
	}
	return best, stacks
}

// stackOf is the allocations of l in stacking order, with their offsets.
func stackOf(l *gpu.Layout) []stacked {
	var st []stacked
	for _, s := range l.Segments {
		for _, b := range s.Blocks {
			if b.State == gpu.BlockAllocated {
				st = append(st, stacked{seq: b.Seq, addr: b.Addr, size: b.Size, stack: b.Stack})
			}
		}
	}
	sort.Slice(st, func(a, b int) bool {
		if st[a].seq != st[b].seq {
			return st[a].seq < st[b].seq
		}
		return st[a].addr < st[b].addr
	})
	var off uint64
	for k := range st {
		st[k].off = off
		off += st[k].size
	}
	return st
}

// columnErr says how column c of b differs from the stack st: a band
// that is not live there or not at its offset (within a quarter of a
// pixel row), an allocation of at least MinBytes in the range that is no
// band, one not drawn as a band that is in no fold, things drawn that
// overlap, or a fold beginning there that does not hold what it says.
func columnErr(b *Bands, q BandsQuery, c int, st []stacked) error {
	quantum := max(1, (b.M1-b.M0)/uint64(4*q.H))
	slack := 2 * quantum
	byKey := map[bandKey]*Band{}
	for i := range b.Bands {
		byKey[keyOf(&liveEntry{seq: b.Bands[i].Seq, addr: b.Bands[i].Addr})] = &b.Bands[i]
	}
	live := map[bandKey]stacked{}
	for _, s := range st {
		live[s.key()] = s
	}
	type span struct{ lo, hi uint64 }
	var spans []span
	for k, band := range byKey {
		off, there := offsetAt(band, c)
		if !there {
			continue
		}
		s, ok := live[k]
		if !ok {
			return fmt.Errorf("band %v is not live", k)
		}
		if absDiff(off, s.off) >= quantum || band.Size != s.size {
			return fmt.Errorf("band %v at %d (%d bytes), live at %d (%d bytes)", k, off, band.Size, s.off, s.size)
		}
		spans = append(spans, span{off, off + band.Size})
	}
	for _, s := range st {
		if s.off >= b.M1 || s.off+s.size <= b.M0 {
			continue
		}
		if band := byKey[s.key()]; band != nil {
			if _, there := offsetAt(band, c); there {
				continue
			}
		}
		if s.size >= b.MinBytes {
			return fmt.Errorf("allocation %v (%d bytes at %d) is in the range but no band", s.key(), s.size, s.off)
		}
		if foldAt(b, c, s.off, s.off+s.size, slack) == nil {
			return fmt.Errorf("allocation %v (%d bytes at %d) is in no fold", s.key(), s.size, s.off)
		}
	}
	for _, f := range b.Folds {
		if c < f.C0 || c > f.C1 {
			continue
		}
		spans = append(spans, span{f.Offset, f.Offset + f.Size})
		if c != f.C0 {
			continue
		}
		count, rep, most := foldHolds(st, f)
		if count == 0 {
			return fmt.Errorf("fold %+v holds nothing", f)
		}
		if count != f.Count || b.Groups[f.Group] != most || rep.seq != f.Rep.Seq || rep.size != f.Rep.Size {
			return fmt.Errorf("fold %+v holds %d allocations, most bytes %q, largest %d (%d bytes); it says %d, %q, %d (%d bytes)",
				f, count, most, rep.seq, rep.size, f.Count, b.Groups[f.Group], f.Rep.Seq, f.Rep.Size)
		}
	}
	for i := range spans {
		for j := range i {
			if spans[i].lo+slack < spans[j].hi && spans[j].lo+slack < spans[i].hi {
				return fmt.Errorf("%v and %v overlap", spans[j], spans[i])
			}
		}
	}
	return nil
}

// A window denser than sweepPerColumn events per column gets fewer
// columns, each sampled at its peak: on the time axis and the event axis,
// whole or zoomed in memory, every column's envelope is its greatest
// allocated bytes after one of its events (as a brute-force replay finds
// them), and what it draws is exactly the stack right after such an
// event: its bands at their offsets, the rest in folds. Fewer columns
// than asked for; on the time axis, usage buckets of one level.
func TestDenseBandsAreTheStackAtEachColumnsPeak(t *testing.T) {
	eachBackend(t, testDenseBandsAreTheStackAtEachColumnsPeak)
}

func testDenseBandsAreTheStackAtEachColumnsPeak(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 300k events")
	}
	// Dense windows of a few hundred thousand events: the columns a
	// budget of events affords, each replayed from a checkpoint.
	defer sweepEvery(150)()
	db, _ := openTemp(t)
	initial, g := initialLayout()
	g.stacks = 5
	evs := g.events(300_000)
	w := writeTrace(t, db, initial, evs, 5)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	ref := &reference{initial, evs}
	before, after := ref.totals()
	first, last := evs[0].TimeUS, evs[len(evs)-1].TimeUS
	rng := rand.New(rand.NewPCG(7, 7))
	for trial := range 6 {
		q := BandsQuery{T0: first - 5, T1: last + 5, W: 1000, H: 150, Events: trial%2 == 1}
		if q.Events {
			q.T0, q.T1 = 0, int64(len(evs))
		}
		if trial >= 2 { // a part of the trace, still dense
			q.W = 300 + rng.IntN(400)
			if q.Events {
				span := int64(len(evs)) / 2
				q.T0 = rng.Int64N(int64(len(evs)) - span)
				q.T1 = q.T0 + span
			} else {
				span := (last - first) / 2
				q.T0 = first + rng.Int64N(last-first-span)
				q.T1 = q.T0 + span
			}
		}
		if trial >= 4 {
			q.M0 = uint64(rng.Int64N(200 << 20))
			q.M1 = q.M0 + 64<<20 + uint64(rng.Int64N(512<<20))
		}
		b, err := db.Bands(w.ID(), q)
		if err != nil {
			t.Fatal(err)
		}
		if b.Sampled != "dense" || b.W >= q.W || b.Samples != b.W || len(b.Allocated) != b.W || len(b.Bands) == 0 || len(b.Folds) == 0 {
			t.Fatalf("%+v: sampled %q, %d samples, %d of %d columns, %d bands, %d folds", q, b.Sampled, b.Samples, b.W, q.W, len(b.Bands), len(b.Folds))
		}
		// The answer's window: the query's, or on the time axis widened
		// to whole columns of a power of two microseconds.
		width := float64(b.T1-b.T0) / float64(b.W)
		if !q.Events && (b.T0 > q.T0 || b.T1 <= q.T1 || width != math.Exp2(math.Round(math.Log2(width)))) {
			t.Fatalf("%+v: dense columns over [%d, %d) of %g us", q, b.T0, b.T1, width)
		}
		colOf := func(e gpu.Event) int {
			k := e.TimeUS
			if q.Events {
				k = e.Seq
			}
			switch {
			case k < b.T0:
				return -1
			case k >= b.T1:
				return b.W
			}
			return min(b.W-1, int(math.Floor(float64(k-b.T0)/width)))
		}
		peaks, stacks := columnPeaks(ref, before, after, b.W, colOf)
		for c := range b.W {
			if b.Allocated[c] != peaks[c] {
				t.Fatalf("%+v column %d: envelope %d, its peak %d", q, c, b.Allocated[c], peaks[c])
			}
			var first error
			for _, st := range stacks[c] {
				if err := columnErr(b, q, c, st); err == nil {
					first = nil
					break
				} else if first == nil {
					first = err
				}
			}
			if first != nil {
				t.Fatalf("%+v column %d (of %d, %d stacks at its peak): %v", q, c, b.W, len(stacks[c]), first)
			}
		}
		t.Logf("%+v: %d columns, %d bands, %d folds, min %d bytes", q, b.W, len(b.Bands), len(b.Folds), b.MinBytes)
	}
}

// PeakSeqs of a dense window: right after each column's event of its
// greatest allocated bytes, as the brute-force replay finds them, on both
// axes; in a swept window, the first such event, exactly.
func TestPeakSeqs(t *testing.T) { eachBackend(t, testPeakSeqs) }

func testPeakSeqs(t *testing.T) {
	db, _ := openTemp(t)
	initial, g := initialLayout()
	evs := g.events(60_000)
	w := writeTrace(t, db, initial, evs, 0)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	_, after := (&reference{initial, evs}).totals()
	first, last := evs[0].TimeUS, evs[len(evs)-1].TimeUS
	rng := rand.New(rand.NewPCG(3, 3))
	for trial := range 16 {
		every := int64(1 << 40)
		if trial%2 == 1 {
			every = 5 + rng.Int64N(40)
		}
		events := trial%4 >= 2
		q := BandsQuery{W: 20 + rng.IntN(400), Events: events}
		if events {
			q.T0 = rng.Int64N(int64(len(evs)) / 2)
			q.T1 = q.T0 + 1000 + rng.Int64N(int64(len(evs))-q.T0-1000)
		} else {
			q.T0 = first + rng.Int64N((last-first)/2)
			q.T1 = q.T0 + 500 + rng.Int64N(last-q.T0-500)
		}
		was := peakSweepPerColumn
		peakSweepPerColumn = every
		seqs, err := db.PeakSeqs(w.ID(), q)
		peakSweepPerColumn = was
		if err != nil {
			t.Fatal(err)
		}
		width := float64(q.T1-q.T0) / float64(q.W)
		colOf := func(e gpu.Event) int {
			k := e.TimeUS
			if events {
				k = e.Seq
			}
			if k < q.T0 || events && k >= q.T1 || !events && k > q.T1 {
				return -1
			}
			return min(q.W-1, int(math.Floor(float64(k-q.T0)/width)))
		}
		best := make([]uint64, q.W)
		firstAt := make([]int64, q.W)
		for c := range firstAt {
			firstAt[c] = -1
		}
		for i, e := range evs {
			if c := colOf(e); c >= 0 && (firstAt[c] < 0 || after[i].Allocated > best[c]) {
				best[c], firstAt[c] = after[i].Allocated, e.Seq
			}
		}
		for c, seq := range seqs {
			if firstAt[c] < 0 {
				continue // a column without events
			}
			if every > 1<<30 && seq != firstAt[c] || after[seq].Allocated != best[c] || colOf(evs[seq]) != c {
				t.Fatalf("%+v, every %d: column %d sampled after event %d (%d bytes), its peak is %d bytes after event %d",
					q, every, c, seq, after[seq].Allocated, best[c], firstAt[c])
			}
		}
	}
}

// A window whose bands would pass the answer's caps (a narrow memory
// range: every free below shifts every band by more than a quarter row)
// makes new bands taller as it goes, and no more than the caps; every
// allocation drawn as a band stays one from the column it was first drawn
// in, at its exact offsets, every one of at least MinBytes in the range is
// a band, and the folds hold the rest: against the brute-force stacks.
func TestBandsPastTheirCaps(t *testing.T) { eachBackend(t, testBandsPastTheirCaps) }

func testBandsPastTheirCaps(t *testing.T) {
	defer sweepEvery(1 << 40)()
	db, _ := openTemp(t)
	initial, g := initialLayout()
	g.stacks = 4
	evs := g.events(60_000)
	w := writeTrace(t, db, initial, evs, 4)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	ref := &reference{initial, evs}
	first, last := evs[0].TimeUS, evs[len(evs)-1].TimeUS
	q := BandsQuery{T0: first, T1: last, W: 1300, H: 100, M0: 2 << 30, M1: 2<<30 + 64<<20}
	b, err := db.Bands(w.ID(), q)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	for _, band := range b.Bands {
		runs += len(band.Runs) / 2
	}
	row := (q.M1 - q.M0 + uint64(q.H) - 1) / uint64(q.H)
	t.Logf("%d bands (%d runs), %d folds, min %d bytes (a row: %d), %d dropped", len(b.Bands), runs, len(b.Folds), b.MinBytes, row, b.Dropped)
	if b.MinBytes <= row || len(b.Bands) > maxBands || runs > maxRuns || len(b.Folds) > maxFoldRuns || b.Dropped > 0 {
		t.Fatalf("past the caps: %d bands, %d runs, %d folds, min %d bytes (a row %d), %d dropped", len(b.Bands), runs, len(b.Folds), b.MinBytes, row, b.Dropped)
	}
	small := 0 // bands under MinBytes: drawn so before the bands grew taller
	for _, band := range b.Bands {
		if band.Size < b.MinBytes {
			small++
		}
	}
	if small == 0 {
		t.Fatal("no band is under MinBytes: the bands did not grow taller on the way")
	}
	dt := float64(q.T1-q.T0) / float64(q.W)
	want := bruteStacks(ref, q.W, func(e gpu.Event) int {
		switch {
		case e.TimeUS < q.T0:
			return -1
		case e.TimeUS > q.T1:
			return q.W
		}
		return min(q.W-1, int(math.Floor(float64(e.TimeUS-q.T0)/dt)))
	})
	for c, st := range want {
		if err := columnErr(b, q, c, st); err != nil {
			t.Fatalf("column %d: %v", c, err)
		}
	}
	// A band goes on while its allocation lives.
	for _, band := range b.Bands {
		if band.C1+1 >= q.W {
			continue
		}
		k := keyOf(&liveEntry{seq: band.Seq, addr: band.Addr})
		for _, s := range want[band.C1+1] {
			if s.key() == k {
				t.Fatalf("band %v (%d bytes) ends at column %d, but it is live after it", k, band.Size, band.C1)
			}
		}
	}
}

// foldHolds is what fold f holds of the stack st: how many allocations,
// the largest, and the group (a stack's first user frame) holding most of
// their bytes, the first such in stacking order.
func foldHolds(st []stacked, f Fold) (count int, rep stacked, most string) {
	label := func(sid gpu.StackID) string {
		if sid == 0 {
			return ""
		}
		return gpu.StackLabel(testStack(int(sid)))
	}
	var order []string
	bytes := map[string]uint64{}
	for _, s := range st {
		if s.off >= f.Offset && s.off+s.size <= f.Offset+f.Size {
			count++
			if s.size > rep.size {
				rep = s
			}
			if _, ok := bytes[label(s.stack)]; !ok {
				order = append(order, label(s.stack))
			}
			bytes[label(s.stack)] += s.size
		}
	}
	for i, l := range order {
		if i == 0 || bytes[l] > bytes[most] {
			most = l
		}
	}
	return count, rep, most
}
