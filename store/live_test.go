package store

import (
	"fmt"
	"testing"

	"vramscope/gpu"
)

// The live set after any event is the layout's allocated blocks, each with
// its segment's stream, the time of its alloc event, its stack and the
// user_metadata of that event.
func TestLiveSet(t *testing.T) { eachBackend(t, testLiveSet) }

func testLiveSet(t *testing.T) {
	db, _ := openTemp(t)
	g := newGen(3, 300)
	g.stacks = 5
	evs := g.events(3*chunkSize + 100)
	w := writeTrace(t, db, nil, evs, 5)
	runs := []gpu.ExtraRun{{Seq: 0, Extra: 1}, {Seq: 1000, Extra: 0}, {Seq: 5000, Extra: 2}}
	w.EventExtras([]gpu.EventExtra{{UserMetadata: "warmup"}, {UserMetadata: "steady"}}, runs)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	metaOf := func(seq int64) string {
		switch {
		case seq < 1000:
			return "warmup"
		case seq < 5000:
			return ""
		}
		return "steady"
	}
	l := gpu.NewLayout(gpu.DefaultRules())
	for i, e := range evs {
		if err := l.Apply(e); err != nil {
			t.Fatal(err)
		}
		if i%997 != 0 && i != len(evs)-1 {
			continue
		}
		ls, err := db.LiveAtSeq(w.ID(), e.Seq)
		if err != nil {
			t.Fatal(err)
		}
		if ls.Seq != e.Seq || ls.TimeUS != e.TimeUS {
			t.Fatalf("after event %d (t %d): live set after %d at %d", e.Seq, e.TimeUS, ls.Seq, ls.TimeUS)
		}
		var n int
		for si := range l.Segments {
			s := &l.Segments[si]
			for _, b := range s.Blocks {
				if b.State != gpu.BlockAllocated {
					continue
				}
				if n >= len(ls.Blocks) {
					t.Fatalf("event %d: the live set lacks %+v", e.Seq, b)
				}
				got := ls.Blocks[n]
				n++
				if got.Block != b || got.Stream != s.Stream || got.AllocUS != evs[b.Seq].TimeUS || got.UserMetadata != metaOf(b.Seq) {
					t.Fatalf("event %d: live block %+v, want %+v on stream %d at %d with %q", e.Seq, got, b, s.Stream, evs[b.Seq].TimeUS, metaOf(b.Seq))
				}
				if b.Stack != 0 && len(ls.Stacks[b.Stack]) != 2 {
					t.Fatalf("event %d: stack %d missing", e.Seq, b.Stack)
				}
			}
		}
		if n != len(ls.Blocks) || ls.Bytes() != l.Figures().Allocated {
			t.Fatalf("event %d: %d live blocks (%d bytes), the layout has %d (%d bytes)", e.Seq, len(ls.Blocks), ls.Bytes(), n, l.Figures().Allocated)
		}
	}
	before, err := db.LiveAtSeq(w.ID(), -1)
	if err != nil || before.Seq != -1 || len(before.Blocks) != 0 {
		t.Errorf("before the trace: %+v, %v", before, err)
	}
	last := evs[len(evs)-1]
	byTime, err := db.LiveAt(w.ID(), last.TimeUS+5)
	if err != nil || byTime.Seq != last.Seq {
		t.Errorf("after the end: %+v, %v", byTime, err)
	}
	if _, err := db.LiveAt("nope", 0); err == nil {
		t.Error("an unknown trace gave a live set")
	}
}

// LiveAtEach gives at each time the live set LiveAt gives, described by
// Read.Describe as LiveAt describes it: from before the trace to after its
// end, over chunk and checkpoint boundaries, with times repeated; times
// that decrease are refused.
func TestLiveAtEach(t *testing.T) { eachBackend(t, testLiveAtEach) }

func testLiveAtEach(t *testing.T) {
	db, _ := openTemp(t)
	g := newGen(5, 300)
	g.stacks = 5
	evs := g.events(3*checkpointEvery + 100)
	w := writeTrace(t, db, nil, evs, 5)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	first, last := evs[0].TimeUS, evs[len(evs)-1].TimeUS
	// close times (walked) and far ones (read from a checkpoint)
	for _, n := range []int64{61, 1} {
		ts := []int64{first - 10, first, first}
		for i := int64(1); i < n; i++ {
			ts = append(ts, first+(last-first)*i/n)
		}
		ts = append(ts, last, last+10)
		i := 0
		err := db.LiveAtEach(w.ID(), ts, func(ls *LiveSet, rd Read) error {
			if err := rd.Describe(ls); err != nil {
				return err
			}
			want, err := db.LiveAt(w.ID(), ts[i])
			if err != nil {
				return err
			}
			if fmt.Sprint(ls) != fmt.Sprint(want) {
				t.Fatalf("%d times: at %d (time %d): %+v\nwant %+v", len(ts), i, ts[i], ls, want)
			}
			i++
			return nil
		})
		if err != nil || i != len(ts) {
			t.Fatalf("%d live sets of %d: %v", i, len(ts), err)
		}
	}
	if err := db.LiveAtEach(w.ID(), []int64{last, first}, func(*LiveSet, Read) error { return nil }); err == nil {
		t.Error("times that decrease were taken")
	}
}

// Peaks gives, for spans of any length and place (overlapping, empty,
// past the end), the first event at the greatest allocated bytes in the
// span, or the state entering it.
func TestPeaks(t *testing.T) { eachBackend(t, testPeaks) }

func testPeaks(t *testing.T) {
	db, _ := openTemp(t)
	evs := newGen(5, 200).events(3 * chunkSize)
	w := writeTrace(t, db, nil, evs, 0)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	// after[i] is the allocated bytes after event i.
	after := make([]uint64, len(evs))
	l := gpu.NewLayout(gpu.DefaultRules())
	for i, e := range evs {
		if err := l.Apply(e); err != nil {
			t.Fatal(err)
		}
		after[i] = l.Figures().Allocated
	}
	first, last := evs[0].TimeUS, evs[len(evs)-1].TimeUS
	spans := []Span{{first, last}, {first - 10, first - 1}, {last + 1, last + 100}, {evs[100].TimeUS, evs[100].TimeUS},
		{evs[500].TimeUS, evs[4000].TimeUS}, {evs[3000].TimeUS, evs[9000].TimeUS}, {evs[7000].TimeUS + 1, evs[7000].TimeUS + 1}}
	got, err := db.Peaks(w.ID(), spans)
	if err != nil {
		t.Fatal(err)
	}
	for k, s := range spans {
		want := Peak{Seq: -1, TimeUS: first}
		for i, e := range evs {
			if e.TimeUS < s.T0 {
				want = Peak{Seq: e.Seq, TimeUS: e.TimeUS, Allocated: after[i]}
				continue
			}
			if e.TimeUS > s.T1 {
				break
			}
			if after[i] > want.Allocated {
				want = Peak{Seq: e.Seq, TimeUS: e.TimeUS, Allocated: after[i]}
			}
		}
		if got[k] != want {
			t.Errorf("span %d %+v: %+v, want %+v", k, s, got[k], want)
		}
	}
	if _, err := db.Peaks(w.ID(), []Span{{5, 4}}); err == nil {
		t.Error("a span ending before it starts was answered")
	}
}

// MetadataChanges lists where user_metadata changes, runs that say the
// same merged, with the time of their first event.
func TestMetadataChanges(t *testing.T) { eachBackend(t, testMetadataChanges) }

func testMetadataChanges(t *testing.T) {
	db, _ := openTemp(t)
	evs := newGen(3, 50).events(3000)
	w := writeTrace(t, db, nil, evs, 0)
	w.EventExtras([]gpu.EventExtra{{UserMetadata: "fwd"}, {UserMetadata: "fwd", CompileContext: "x"}, {UserMetadata: "bwd"}},
		[]gpu.ExtraRun{{Seq: 10, Extra: 1}, {Seq: 20, Extra: 2}, {Seq: 500, Extra: 3}, {Seq: 2000, Extra: 0}})
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	got, total, err := db.MetadataChanges(w.ID(), 2)
	if err != nil || total != 3 || len(got) != 2 {
		t.Fatalf("%+v of %d, %v", got, total, err)
	}
	want := []MetadataChange{{10, evs[10].TimeUS, "fwd"}, {500, evs[500].TimeUS, "bwd"}}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("change %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	all, _, _ := db.MetadataChanges(w.ID(), 10)
	if len(all) != 3 || all[2] != (MetadataChange{2000, evs[2000].TimeUS, ""}) {
		t.Errorf("all changes %+v", all)
	}
}
