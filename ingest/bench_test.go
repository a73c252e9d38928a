package ingest_test

import (
	"context"
	"testing"

	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
)

// BenchmarkExportStored: a stored snapshot read back and written as a
// pickle (training_22k_user_metadata: 22,331 events, 234 segments), as
// vramscope export does, to a counter.
func BenchmarkExportStored(b *testing.B) {
	db := testkit.OpenDB(b)
	traces, err := pytorch.DecodeFile(testkit.Snapshot(b, "training_22k_user_metadata.pickle"))
	if err != nil {
		b.Fatal(err)
	}
	ids, err := ingest.Store(context.Background(), db, traces, "bench")
	if err != nil {
		b.Fatal(err)
	}
	var n countingWriter
	events := 0
	for b.Loop() {
		back, err := ingest.Traces(db, ids[0], -1)
		if err != nil {
			b.Fatal(err)
		}
		if err := pytorch.Export(&n, back...); err != nil {
			b.Fatal(err)
		}
		events += len(back[0].Events)
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
}

type countingWriter int

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}
