package compare_test

import (
	"testing"

	"vramscope/attrib"
	"vramscope/compare"
	"vramscope/internal/testkit"
	"vramscope/store"
	"vramscope/tracer"
)

// smallTrain is a training run small enough for tests.
func smallTrain(checkpointing bool) tracer.Train {
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 2048, 4, 1024, 3
	w.Checkpointing = checkpointing
	return w
}

// twoRuns records the same training run with and without activation
// checkpointing.
func twoRuns(t *testing.T, db *store.DB) (with, without string) {
	with = testkit.Record(t, db, "checkpointing", smallTrain(true), 80<<30, "")
	without = testkit.Record(t, db, "no checkpointing", smallTrain(false), 80<<30, "")
	return with, without
}

func TestExplore(t *testing.T) {
	db := testkit.OpenDB(t)
	a, b := twoRuns(t, db)
	for _, al := range []compare.Align{compare.ByTime, compare.ByStep, compare.ByEvent} {
		r, err := compare.Compare(db, a, b, compare.Options{Align: al, Group: attrib.ByFrame, Rows: 5})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("align %s used %s %q steps A %v B %v", al, r.Align, r.Note, r.A.Steps, r.B.Steps)
		for _, m := range r.Moments {
			t.Logf("  %s x=%d A %+v B %+v div %d", m.Key, m.X, m.A, m.B, m.Divergence)
			for _, row := range m.Rows {
				t.Logf("     %-50q A %d B %d delta %d", row.Label, row.A, row.B, row.Delta)
			}
		}
	}
}
