package compare_test

import (
	"testing"

	"vramscope/compare"
	"vramscope/internal/testkit"
	"vramscope/tracer"
)

// BenchmarkCompare is one comparison (by step, grouped by first user
// frame, the what-if replays left out): two GPT-2-XL-sized training runs
// of 50 steps with and without checkpointing, two real cs336 snapshots,
// and the 951,877-event PyTorch 2.11 recording with itself by time and as
// the page opens it (auto: its requests read to find it is one program,
// then aligned by request; their requests read anew, or kept).
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
	// auto-cold reads both traces' requests each time, as the first
	// comparison of them does; auto keeps them, as the page's next
	// questions (a zoom, a click) find them.
	for _, c := range []struct {
		name string
		al   compare.Align
		cold bool
	}{{"time", compare.ByTime, false}, {"auto-cold", compare.Auto, true}, {"auto", compare.Auto, false}} {
		b.Run("big211/"+c.name, func(b *testing.B) {
			db := testkit.OpenDB(b)
			ids := importSnapshots(b, db, "pytorch-2.11/big.pickle.gz", "pytorch-2.11/big.pickle.gz")
			b.ResetTimer()
			for b.Loop() {
				if c.cold {
					compare.ForgetRequests()
				}
				if _, err := compare.Compare(db, ids[0], ids[1], compare.Options{Align: c.al}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
