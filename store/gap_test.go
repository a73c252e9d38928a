package store

import (
	"testing"

	"vramscope/gpu"
)

// A live trace's gap is stored with the events that fill it, in the same
// commit, and read while the trace is still live; a resumed writer goes on
// from the gaps stored (the live hub numbers its client's events by them).
func TestGapStoredAndResumed(t *testing.T) { eachBackend(t, testGapStoredAndResumed) }

func testGapStoredAndResumed(t *testing.T) {
	db, _ := openTemp(t)
	w, err := db.CreateTrace(gpu.TraceMeta{Name: "job", Source: gpu.SourceLive}, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := uint64(1 << 30)
	w.Emit([]gpu.Event{{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: base, Size: 2 << 20, Pool: gpu.PoolSmall},
		{Seq: 1, TimeUS: 2, Action: gpu.ActionAlloc, Addr: base, Size: 512}})
	// The job's state after entries that were lost: the block freed, another made.
	want := gpu.NewLayout(gpu.DefaultRules())
	for _, e := range []gpu.Event{{Action: gpu.ActionSegmentAlloc, Addr: base, Size: 2 << 20, Pool: gpu.PoolSmall},
		{Action: gpu.ActionAlloc, Addr: base, Size: 1024}, {Action: gpu.ActionAlloc, Addr: base + 1024, Size: 512}} {
		if err := want.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	fill, err := w.Layout().EventsTo(want)
	if err != nil {
		t.Fatal(err)
	}
	for i := range fill {
		fill[i].Seq, fill[i].TimeUS = int64(2+i), 3
	}
	w.EmitGap(gpu.Gap{AfterSeq: 1, Seq: int64(2 + len(fill)), TimeUS: 3, Lost: 40, Filled: int64(len(fill))}, fill)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	tr, err := db.Trace(w.ID())
	if err != nil || tr.Status != gpu.StatusLive || tr.Dropped == nil || tr.Dropped.GapCount != 1 || tr.Dropped.Filled != int64(len(fill)) || tr.Events != int64(2+len(fill)) {
		t.Fatalf("while live: %+v %+v %v", tr, tr.Dropped, err)
	}
	if err := w.Close(gpu.StatusIncomplete); err != nil {
		t.Fatal(err)
	}
	r, _, err := db.ResumeTrace(w.ID())
	if err != nil {
		t.Fatal(err)
	}
	if d := r.Dropped(); d == nil || d.GapCount != 1 || d.Lost != 40 {
		t.Fatalf("resumed with %+v", d)
	}
	if !r.Layout().Same(want) {
		t.Fatal("the resumed layout is not the job's")
	}
	next := int64(2 + len(fill))
	r.EmitGap(gpu.Gap{AfterSeq: next - 1, Seq: next, TimeUS: 4, Lost: -1}, nil)
	if err := r.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	tr, _ = db.Trace(w.ID())
	if d := tr.Dropped; d == nil || d.GapCount != 2 || d.Lost != 40 || len(d.Gaps) != 2 || d.Gaps[1].Lost != -1 {
		t.Fatalf("at the end: %+v", d)
	}
}
