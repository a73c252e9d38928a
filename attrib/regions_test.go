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

// While a job runs, its steps' annotations can come ahead of their
// events: a step that has started and not ended, begun after the trace's
// last event, is answered as open, with the peak it has so far (the state
// it began in), never as an error; and once it ends, with its own.
func TestOpenStepAheadOfItsEvents(t *testing.T) { testkit.EachBackend(t, testOpenStepAheadOfItsEvents) }

func testOpenStepAheadOfItsEvents(t *testing.T) {
	db := testkit.OpenDB(t)
	w, err := db.CreateTrace(gpu.TraceMeta{Name: "running", Source: gpu.SourceLive}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const seg = 1 << 20
	w.Emit([]gpu.Event{
		{Seq: 0, TimeUS: 10, Action: gpu.ActionSegmentAlloc, Addr: seg, Size: 2 << 20},
		{Seq: 1, TimeUS: 11, Action: gpu.ActionAlloc, Addr: seg, Size: 4096},
		{Seq: 2, TimeUS: 30, Action: gpu.ActionFreeRequested, Addr: seg, Size: 4096},
		{Seq: 3, TimeUS: 30, Action: gpu.ActionFreeCompleted, Addr: seg, Size: 4096},
	})
	w.Annotate(gpu.Annotation{TimeUS: 10, Stage: "START", Name: "ProfilerStep#0"},
		gpu.Annotation{TimeUS: 40, Stage: "END", Name: "ProfilerStep#0"},
		gpu.Annotation{TimeUS: 41, Stage: "START", Name: "ProfilerStep#1"}) // its events are yet to come
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	steps := func() attrib.StepsAnswer {
		t.Helper()
		c, err := attrib.NewCategorizer(db, w.ID())
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.StepPeaks(0, 10)
		if err != nil {
			t.Fatalf("steps of a running job: %v", err)
		}
		if len(out.Steps) != 2 {
			t.Fatalf("steps %+v", out.Steps)
		}
		return out
	}
	s := steps().Steps
	if s[0].Open || s[0].Peak.Seq != 1 || s[0].Peak.Allocated != 4096 {
		t.Errorf("the ended step: %+v", s[0])
	}
	if !s[1].Open || s[1].StartUS != 41 || s[1].EndUS != 41 || s[1].Peak.Seq != 3 || s[1].Peak.Allocated != 0 {
		t.Errorf("the step begun after the last event: %+v; want open at 41, entered after event 3 with nothing allocated", s[1])
	}
	w.Emit([]gpu.Event{{Seq: 4, TimeUS: 45, Action: gpu.ActionAlloc, Addr: seg, Size: 8192}})
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if s := steps().Steps; !s[1].Open || s[1].EndUS != 46 || s[1].Peak.Seq != 4 || s[1].Peak.Allocated != 8192 {
		t.Errorf("the open step once its first event came: %+v", s[1])
	}
	w.Annotate(gpu.Annotation{TimeUS: 50, Stage: "END", Name: "ProfilerStep#1"})
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if s := steps().Steps; s[1].Open || s[1].EndUS != 50 || s[1].Peak.Seq != 4 {
		t.Errorf("the step once ended: %+v", s[1])
	}
}
