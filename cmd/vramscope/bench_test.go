package main

import (
	"context"
	"path/filepath"
	"testing"

	"vramscope/store"
	"vramscope/tracer"
)

// BenchmarkTraceEndToEnd: a workload through the caching allocator on the
// simulated device into the SQLite store, events per second end to end.
func BenchmarkTraceEndToEnd(b *testing.B) {
	w := tracer.DefaultTrain()
	w.Steps = 40
	var events int64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		db, err := store.Open(filepath.Join(b.TempDir(), "e.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := record(context.Background(), db, recording{Name: "bench", Workload: w, Device: "sim", Capacity: 80 << 30}, nil)
		if err != nil || res.Err != nil {
			b.Fatal(err, res.Err)
		}
		events += res.Trace.Events
		b.StopTimer()
		db.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
}
