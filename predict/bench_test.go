package predict

import (
	"testing"

	"vramscope/replay"
)

// BenchmarkFit is vramscope fit over a pair of recordings of the training
// workload of about a million events each (batch 2 and 4, 8 layers, 1333
// steps): the alignment and the fit, then 8 batch sizes replayed,
// each with the memory it needs under the recorded settings, and the
// largest batch that fits the recorded 80 GiB device.
func BenchmarkFit(b *testing.B) {
	var recs []Recording
	var events int
	for _, batch := range []int{2, 4} {
		w := job(batch, 1024)
		w.Steps = 1_000_000 / 750 // each step makes some 750 events
		r := record(b, w, 80<<30)
		events += len(r.rec.Events)
		recs = append(recs, Recording{Name: "batch", At: batch, Stream: replay.FromRecording(r.rec)})
	}
	o := Options{At: []int{1, 2, 4, 8, 16, 24, 32, 48}}
	b.ResetTimer()
	for b.Loop() {
		if _, err := Answer(Batch, recs, o); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(events)/2, "events/recording")
	b.ReportMetric(float64(len(recs[0].Stream.Requests)), "requests/recording")
}
