package store

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"vramscope/gpu"
)

// stacked is an allocation of the reference stack at an instant, with its
// offset in the stack.
type stacked struct {
	seq             int64
	addr, off, size uint64
	stack           gpu.StackID
}

func (s stacked) key() bandKey { return keyOf(&liveEntry{seq: s.seq, addr: s.addr}) }

// bruteStacks is the reference stack of each of w columns: the
// allocations live right after the column's event after which the layout's
// allocated bytes are greatest (the first of them), or, for a column
// without events, after every event before it; in stacking order. colOf
// gives an event's column, -1 before the window, w after it.
func bruteStacks(ref *reference, w int, colOf func(e gpu.Event) int) [][]stacked {
	l := ref.initial.Clone()
	out := make([][]stacked, w)
	best := make([]uint64, w)
	next := 0 // the first column not reached by an event yet
	for _, e := range ref.evs {
		c := colOf(e)
		if c >= w {
			break
		}
		for ; next < c; next++ {
			if out[next] == nil {
				out[next] = stackOf(l)
			}
		}
		if err := l.Apply(e); err != nil {
			panic(err)
		}
		if c < 0 {
			continue
		}
		if a := l.Figures().Allocated; out[c] == nil || a > best[c] {
			out[c], best[c] = stackOf(l), a
		}
		next = c
	}
	for ; next < w; next++ {
		if out[next] == nil {
			out[next] = stackOf(l)
		}
	}
	return out
}

// offsetAt is band b's offset in column c, or false when it is not there.
func offsetAt(b *Band, c int) (uint64, bool) {
	if c < b.C0 || c > b.C1 {
		return 0, false
	}
	off := b.Runs[1]
	for r := 0; r < len(b.Runs) && b.Runs[r] <= int64(c); r += 2 {
		off = b.Runs[r+1]
	}
	return uint64(off), true
}

func TestBandsAreTheExactStack(t *testing.T) { eachBackend(t, testBandsAreTheExactStack) }

func testBandsAreTheExactStack(t *testing.T) {
	defer sweepEvery(1 << 40)() // every window swept: dense ones have tests of their own
	db, _ := openTemp(t)
	initial, g := initialLayout()
	evs := g.events(30000)
	w := writeTrace(t, db, initial, evs, 0)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	ref := &reference{initial, evs}
	first, last := evs[0].TimeUS, evs[len(evs)-1].TimeUS
	rng := rand.New(rand.NewPCG(4, 4))
	for trial := range 12 {
		q := BandsQuery{T0: first - 5, T1: last + 5, W: 80, H: 200}
		if trial > 0 {
			span := max(2, int64(float64(last-first)*math.Pow(10, -3*rng.Float64())))
			q.T0 = first + rng.Int64N(last-first-span+2)
			q.T1 = q.T0 + span
			q.W = 20 + rng.IntN(100)
		}
		if trial%3 == 2 { // a narrow memory range: small allocations become bands
			q.M0 = uint64(rng.Int64N(400 << 20))
			q.M1 = q.M0 + 1<<20 + uint64(rng.Int64N(64<<20))
		}
		b, err := db.Bands(w.ID(), q)
		if err != nil {
			t.Fatal(err)
		}
		if b.Sampled != "columns" || b.Samples != q.W || len(b.Allocated) != q.W {
			t.Fatalf("%+v: sampled %q %d times, %d columns", q, b.Sampled, b.Samples, len(b.Allocated))
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
		quantum := max(1, (b.M1-b.M0)/uint64(4*q.H))
		byKey := map[bandKey]*Band{}
		for i := range b.Bands {
			byKey[keyOf(&liveEntry{seq: b.Bands[i].Seq, addr: b.Bands[i].Addr})] = &b.Bands[i]
		}
		shown := 0
		for c, st := range want {
			present := map[bandKey]bool{}
			for _, s := range st {
				present[s.key()] = true
				band := byKey[s.key()]
				inRange := s.size >= b.MinBytes && s.off < b.M1 && s.off+s.size > b.M0
				off, there := uint64(0), false
				if band != nil {
					off, there = offsetAt(band, c)
				}
				if inRange && !there {
					t.Fatalf("%+v column %d: allocation %v (%d bytes at %d) is in range but not a band", q, c, s.key(), s.size, s.off)
				}
				if there {
					shown++
					if absDiff(off, s.off) >= quantum || band.Size != s.size {
						t.Fatalf("%+v column %d: band %v at %d (%d bytes), want %d (%d bytes)", q, c, s.key(), off, band.Size, s.off, s.size)
					}
				}
			}
			for k, band := range byKey {
				if _, there := offsetAt(band, c); there && !present[k] {
					t.Fatalf("%+v column %d: band %v is not live there", q, c, k)
				}
			}
		}
		t.Logf("%+v: %d bands, %d band-columns, min %d bytes", q, len(b.Bands), shown, b.MinBytes)
	}
}

// sweepEvery sets sweepPerColumn for a test, returning what puts it
// back.
func sweepEvery(n int64) func() {
	was := sweepPerColumn
	sweepPerColumn = n
	return func() { sweepPerColumn = was }
}

func TestBandsRefuseBadQueries(t *testing.T) { eachBackend(t, testBandsRefuseBadQueries) }

func testBandsRefuseBadQueries(t *testing.T) {
	db, _ := openTemp(t)
	w := writeTrace(t, db, nil, newGen(1, 10).events(100), 0)
	w.Close(gpu.StatusComplete)
	for _, q := range []BandsQuery{{T0: 5, T1: 5, W: 1, H: 1}, {T0: 0, T1: 5, W: 0, H: 1}, {T0: 0, T1: 5, W: 1, H: 1, M0: 9, M1: 9}} {
		if _, err := db.Bands(w.ID(), q); err == nil {
			t.Errorf("%+v: no error", q)
		}
	}
	if _, err := db.Bands("nope", BandsQuery{T0: 0, T1: 5, W: 1, H: 1}); err == nil {
		t.Error("unknown trace: no error")
	}
	_ = fmt.Sprint()
}
