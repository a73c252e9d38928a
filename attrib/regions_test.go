package attrib_test

import (
	"testing"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/internal/testkit"
)

func TestRegions(t *testing.T) {
	ann := func(t int64, stage, name string) gpu.Annotation {
		return gpu.Annotation{TimeUS: t, Stage: stage, Name: name}
	}
	got := attrib.Regions([]gpu.Annotation{
		ann(10, "START", "ProfilerStep#0"),
		ann(12, "START", "## forward ##"),
		ann(20, "END", "## forward ##"),
		ann(30, "START", "Optimizer.step#AdamW.step"),
		ann(31, "START", "Optimizer.step#AdamW.step"), // nested, same name: the last START takes the first END
		ann(33, "END", "Optimizer.step#AdamW.step"),
		ann(35, "END", "Optimizer.step#AdamW.step"),
		ann(36, "END", "never started"),
		ann(40, "END", "ProfilerStep#0"),
		ann(41, "START", "step 1"),
		ann(5, "START", "torch-compiled region"), // out of order: sorted by time
	}, 100)
	want := []attrib.Region{
		{Name: "torch-compiled region", StartUS: 5, EndUS: 100, Open: true, Depth: 0, Step: -1},
		{Name: "ProfilerStep#0", StartUS: 10, EndUS: 40, Depth: 1, Step: 0},
		{Name: "## forward ##", StartUS: 12, EndUS: 20, Depth: 2, Step: -1, Phase: attrib.PhaseForward},
		{Name: "Optimizer.step#AdamW.step", StartUS: 30, EndUS: 35, Depth: 2, Step: -1, Phase: attrib.PhaseOptimizer},
		{Name: "Optimizer.step#AdamW.step", StartUS: 31, EndUS: 33, Depth: 3, Step: -1, Phase: attrib.PhaseOptimizer},
		{Name: "step 1", StartUS: 41, EndUS: 100, Open: true, Depth: 1, Step: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("regions %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("region %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if s := attrib.Steps(got); len(s) != 2 || s[0].Step != 0 || s[1].Step != 1 {
		t.Errorf("steps %+v", s)
	}
	for name, step := range map[string]int{"ProfilerStep#12": 12, "train_step#3": 3, "Step 7": 7, "stepper 1": -1, "ProfilerStep#x": -1, "Optimizer.step#SGD.step": -1} {
		if r := attrib.Regions([]gpu.Annotation{ann(1, "START", name)}, 2); r[0].Step != step {
			t.Errorf("%q: step %d, want %d", name, r[0].Step, step)
		}
	}
}

// A cached categorizer serves a trace while it does not change; a trace
// that grew, or closed, gets a new one, with its new regions.
func TestCacheFollowsTheTrace(t *testing.T) {
	db := testkit.OpenDB(t)
	w, err := db.CreateTrace(gpu.TraceMeta{Name: "growing", Source: gpu.SourceLive}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Emit([]gpu.Event{{Seq: 0, TimeUS: 10, Action: gpu.ActionSegmentAlloc, Addr: 1 << 20, Size: 2 << 20}})
	w.Annotate(gpu.Annotation{TimeUS: 10, Stage: "START", Name: "ProfilerStep#0"})
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	cache := attrib.NewCache(2)
	a, err := cache.Categorizer(db, w.ID())
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := cache.Categorizer(db, w.ID()); b != a {
		t.Error("an unchanged trace got a new categorizer")
	}
	w.Emit([]gpu.Event{{Seq: 1, TimeUS: 20, Action: gpu.ActionAlloc, Addr: 1 << 20, Size: 4096}})
	w.Annotate(gpu.Annotation{TimeUS: 25, Stage: "END", Name: "ProfilerStep#0"})
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	b, err := cache.Categorizer(db, w.ID())
	if err != nil || b == a {
		t.Fatalf("the trace grew and closed, the categorizer stayed (%v)", err)
	}
	if r := b.Regions(); len(r) != 1 || r[0].Open || r[0].EndUS != 25 {
		t.Errorf("regions after the END: %+v", r)
	}
	if _, err := cache.Categorizer(db, "nope"); err == nil {
		t.Error("an unknown trace got a categorizer")
	}
}
