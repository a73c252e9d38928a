package main

import (
	"testing"

	"vramscope/internal/testkit"
	"vramscope/store"
)

// An empty database gets the demo traces and the demo run, once; the run's
// first pipeline stage peaks highest, as its page should show.
func TestSeedDemo(t *testing.T) {
	db := testkit.OpenDB(t)
	if err := seedDemo(db); err != nil {
		t.Fatal(err)
	}
	traces, err := db.Traces()
	if err != nil {
		t.Fatal(err)
	}
	rec, job := demoRun()
	if want := len(demoRecordings()) + job.Ranks; len(traces) != want {
		t.Fatalf("%d traces, want %d", len(traces), want)
	}
	_, total, err := db.TraceList(store.ListQuery{GroupRuns: true})
	if err != nil || total != len(demoRecordings())+1 {
		t.Fatalf("the grouped list has %d rows (%v), want the demo traces and one run", total, err)
	}
	found := false
	for _, tr := range traces {
		of, ok, err := db.RunOf(tr.Upload)
		if err != nil || !ok {
			continue
		}
		found = true
		run, err := db.Run(of.ID)
		if err != nil {
			t.Fatal(err)
		}
		if run.Name != rec.Name || len(run.Ranks) != job.Ranks {
			t.Fatalf("run %q of %d ranks", run.Name, len(run.Ranks))
		}
		stage0 := run.Ranks[0].Traces[0]
		for _, rk := range run.Ranks[1:] {
			if rk.Traces[0].PeakAllocated >= stage0.PeakAllocated {
				t.Errorf("rank %d peaks at %d, stage 0 at %d", rk.Rank, rk.Traces[0].PeakAllocated, stage0.PeakAllocated)
			}
		}
		break
	}
	if !found {
		t.Fatal("no trace of the demo is a rank of a run")
	}
	if err := seedDemo(db); err != nil {
		t.Fatal(err)
	}
	if again, _ := db.Traces(); len(again) != len(traces) {
		t.Errorf("a second seeding left %d traces, want %d", len(again), len(traces))
	}
}
