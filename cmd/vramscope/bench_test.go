package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"vramscope/internal/testkit"
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

// BenchmarkImportRunCommands: a run of 8 rank files of ~100 MB (the
// synthetic snapshot) imported as a user does without runs, one
// vramscope import after another (serial-s), and with one vramscope
// import --run (run-s), each command a process of its own, in the same
// iteration; speedup is their ratio. ingest's BenchmarkImportRun compares
// the same within one process. Run it with -benchtime 1x.
func BenchmarkImportRunCommands(b *testing.B) {
	path := testkit.SyntheticSnapshot(b, 450_000)
	dir := b.TempDir()
	var files []string
	for i := range 8 {
		f := filepath.Join(dir, fmt.Sprintf("rank%d.pickle", i))
		if err := os.Symlink(path, f); err != nil {
			b.Fatal(err)
		}
		files = append(files, f)
	}
	command := func(args ...string) {
		if out, err := vramscope(b, args...).CombinedOutput(); err != nil {
			b.Fatalf("vramscope %v: %v\n%s", args, err, out)
		}
	}
	var serial, run time.Duration
	for i := 0; b.Loop(); i++ {
		db := filepath.Join(dir, fmt.Sprintf("serial%d.db", i))
		start := time.Now()
		for _, f := range files {
			command("import", "--db", db, f)
		}
		serial += time.Since(start)
		db = filepath.Join(dir, fmt.Sprintf("run%d.db", i))
		start = time.Now()
		command(append([]string{"import", "--db", db, "--run", "job"}, files...)...)
		run += time.Since(start)
	}
	b.ReportMetric(serial.Seconds()/float64(b.N), "serial-s")
	b.ReportMetric(run.Seconds()/float64(b.N), "run-s")
	b.ReportMetric(serial.Seconds()/run.Seconds(), "speedup")
}
