package compare_test

import (
	"testing"

	"vramscope/compare"
	"vramscope/internal/testkit"
	"vramscope/tracer"
)

// BenchmarkCompare is one comparison (by step, grouped by first user
// frame, the what-if replays left out): two GPT-2-XL-sized training runs
// of 50 steps with and without checkpointing, and two real cs336 snapshots.
func BenchmarkCompare(b *testing.B) {
	b.Run("train", func(b *testing.B) {
		db := testkit.OpenDB(b)
		var ids []string
		for _, cp := range []bool{true, false} {
			w := tracer.DefaultTrain()
			w.Steps, w.Checkpointing = 50, cp
			ids = append(ids, testkit.Record(b, db, "train", w, 80<<30, ""))
		}
		ta, _ := db.Trace(ids[0])
		tb, _ := db.Trace(ids[1])
		b.ResetTimer()
		for b.Loop() {
			if _, err := compare.Compare(db, ids[0], ids[1], compare.Options{Align: compare.ByStep}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(ta.Events+tb.Events), "events")
	})
	b.Run("real", func(b *testing.B) {
		db := testkit.OpenDB(b)
		ids := importSnapshots(b, db, "training_22k_user_metadata.pickle", "uint64_line_annotations.pickle")
		b.ResetTimer()
		for b.Loop() {
			if _, err := compare.Compare(db, ids[0], ids[1], compare.Options{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
