package store

import (
	"math"
	"math/rand/v2"
	"testing"

	"vramscope/gpu"
)

// foldAt is the fold of b over column c holding offset off (within slack),
// or nil.
func foldAt(b *Bands, c int, lo, hi, slack uint64) *Fold {
	for i := range b.Folds {
		f := &b.Folds[i]
		if c >= f.C0 && c <= f.C1 && f.Offset <= lo+slack && hi <= f.Offset+f.Size+slack {
			return f
		}
	}
	return nil
}

// Folded bands tile what no band draws: against the stacks a brute-force
// replay gives each column (at its peak), on the time axis and the event
// axis, each column is as columnErr checks it: every band live at its
// offset, every allocation in the visible range too small to be a band
// inside a fold of that column, no fold overlapping a band or another
// fold, and each fold, where its run begins, holding exactly Count
// allocations, naming the group (a stack's first user frame) holding most
// of its bytes, with the largest of them as its representative.
func TestFoldsTileTheStack(t *testing.T) { eachBackend(t, testFoldsTileTheStack) }

func testFoldsTileTheStack(t *testing.T) {
	defer sweepEvery(1 << 40)() // every window swept: dense ones have tests of their own
	db, _ := openTemp(t)
	initial, g := initialLayout()
	g.stacks = 6
	evs := g.events(30000)
	w := writeTrace(t, db, initial, evs, 6)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	ref := &reference{initial, evs}
	first, last := evs[0].TimeUS, evs[len(evs)-1].TimeUS
	rng := rand.New(rand.NewPCG(9, 9))
	folds := 0
	for trial := range 10 {
		q := BandsQuery{T0: first - 5, T1: last + 5, W: 60, H: 120, Events: trial%2 == 1}
		if q.Events {
			q.T0, q.T1 = 0, int64(len(evs))
		}
		if trial > 1 {
			q.W = 20 + rng.IntN(80)
			if q.Events {
				span := max(2, int64(float64(len(evs))*math.Pow(10, -2*rng.Float64())))
				q.T0 = rng.Int64N(int64(len(evs)) - span + 1)
				q.T1 = q.T0 + span
			} else {
				span := max(2, int64(float64(last-first)*math.Pow(10, -2*rng.Float64())))
				q.T0 = first + rng.Int64N(last-first-span+2)
				q.T1 = q.T0 + span
			}
		}
		if trial%4 == 3 {
			q.M0 = uint64(rng.Int64N(300 << 20))
			q.M1 = q.M0 + 16<<20 + uint64(rng.Int64N(256<<20))
		}
		b, err := db.Bands(w.ID(), q)
		if err != nil {
			t.Fatal(err)
		}
		colOf := func(e gpu.Event) int {
			if q.Events {
				return int(math.Floor(float64(e.Seq-q.T0) / (float64(q.T1-q.T0) / float64(q.W))))
			}
			switch {
			case e.TimeUS < q.T0:
				return -1
			case e.TimeUS > q.T1:
				return q.W
			}
			return min(q.W-1, int(math.Floor(float64(e.TimeUS-q.T0)/(float64(q.T1-q.T0)/float64(q.W)))))
		}
		want := bruteStacks(ref, q.W, colOf)
		for c, st := range want {
			if err := columnErr(b, q, c, st); err != nil {
				t.Fatalf("%+v column %d: %v", q, c, err)
			}
		}
		folds += len(b.Folds)
	}
	if folds == 0 {
		t.Fatal("no fold was checked")
	}
}

// The event axis's usage: in columns of equal counts of events, each the
// least and greatest totals entering it and after each of its events, as
// the reference replay gives them; and each column's time is its first
// event's.
func TestUsageByEvent(t *testing.T) { eachBackend(t, testUsageByEvent) }

func testUsageByEvent(t *testing.T) {
	db, _ := openTemp(t)
	initial, g := initialLayout()
	evs := g.events(20000)
	w := writeTrace(t, db, initial, evs, 0)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	before, after := (&reference{initial, evs}).totals()
	rng := rand.New(rand.NewPCG(5, 5))
	for trial := range 8 {
		s0, s1, n := int64(0), int64(len(evs)), 100
		if trial > 0 {
			s0 = rng.Int64N(int64(len(evs)) - 10)
			s1 = s0 + 1 + rng.Int64N(int64(len(evs))-s0)
			n = 1 + rng.IntN(300)
		}
		u, err := db.UsageByEvent(w.ID(), s0, s1, n)
		if err != nil {
			t.Fatal(err)
		}
		cols := len(u.Events)
		for c := range cols {
			from := s0 + int64(math.Ceil(float64(c)*u.Width))
			to := min(s1, s0+int64(math.Ceil(float64(c+1)*u.Width)))
			enter := before
			if from > 0 {
				enter = after[from-1]
			}
			lo, hi := enter, enter
			for s := from; s < to; s++ {
				lo, hi = minTotals(lo, after[s]), maxTotals(hi, after[s])
			}
			got := [][2]uint64{{u.Reserved[2*c], u.Reserved[2*c+1]}, {u.Allocated[2*c], u.Allocated[2*c+1]}, {u.Active[2*c], u.Active[2*c+1]}}
			wantR := [][2]uint64{{lo.Reserved, hi.Reserved}, {lo.Allocated, hi.Allocated}, {lo.Active, hi.Active}}
			if got[0] != wantR[0] || got[1] != wantR[1] || got[2] != wantR[2] {
				t.Fatalf("[%d, %d) in %d: column %d (events %d..%d): %v, want %v", s0, s1, n, c, from, to-1, got, wantR)
			}
			if from < to && u.Times[c] != evs[from].TimeUS {
				t.Fatalf("column %d begins at %d, its first event %d is at %d", c, u.Times[c], from, evs[from].TimeUS)
			}
		}
		if u.Times[cols] != evs[s1-1].TimeUS {
			t.Fatalf("the window ends at %d, its last event at %d", u.Times[cols], evs[s1-1].TimeUS)
		}
	}
}
