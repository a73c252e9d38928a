package ingest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"testing"
	"time"
	"vramscope/internal/pgtest"

	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
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

// BenchmarkImport100MB: the whole import of the ~100 MB synthetic
// snapshot (450k trace entries, 66k blocks), decoding and storing, into
// a fresh database each time, with the garbage collector set as vramscope
// import sets it; bytes are the file's.
func BenchmarkImport100MB(b *testing.B) {
	benchImport(b, testkit.SyntheticSnapshot(b, 450_000))
}

// BenchmarkImport616MB is BenchmarkImport100MB on a 616 MB snapshot
// (3.19M trace entries); run it with -benchtime 1x.
func BenchmarkImport616MB(b *testing.B) {
	benchImport(b, testkit.SyntheticSnapshot(b, 3_190_000))
}

func benchImport(b *testing.B, path string) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(ingest.MemoryLimit([]string{path})))
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(st.Size())
	dir := b.TempDir()
	i := 0
	for b.Loop() {
		b.StopTimer()
		db, err := store.Open(benchDB(b, dir, fmt.Sprintf("import%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		i++
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := ingest.Snapshot(db, f, "bench", pytorch.Options{}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		f.Close()
		db.Close()
		if !store.IsPostgres(db.Path()) {
			os.Remove(db.Path())
		}
		b.StartTimer()
	}
}

// BenchmarkImportRun: a run of 8 rank files of ~100 MB (the synthetic
// snapshot), imported one after another (serial-s) and as one run on
// every core (run-s), in the same iteration; speedup is their ratio.
// Run it with -benchtime 1x.
func BenchmarkImportRun(b *testing.B) {
	path := testkit.SyntheticSnapshot(b, 450_000)
	paths := slices.Repeat([]string{path}, 8)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	dir := b.TempDir()
	var serial, run time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		db, err := store.Open(benchDB(b, dir, fmt.Sprintf("serial%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		debug.SetMemoryLimit(ingest.MemoryLimit(paths[:1])) // as vramscope import sets it
		start := time.Now()
		for _, p := range paths {
			f, err := os.Open(p)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ingest.Snapshot(db, f, "bench", pytorch.Options{}); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
		serial += time.Since(start)
		db.Close()
		if !store.IsPostgres(db.Path()) {
			os.Remove(db.Path())
		}
		if db, err = store.Open(benchDB(b, dir, fmt.Sprintf("run%d", i))); err != nil {
			b.Fatal(err)
		}
		debug.SetMemoryLimit(ingest.MemoryLimit(paths))
		runtime.GC()
		start = time.Now()
		if _, _, err := ingest.Run(context.Background(), db, "bench", ingest.Files(paths), pytorch.Options{}); err != nil {
			b.Fatal(err)
		}
		run += time.Since(start)
		db.Close()
		if !store.IsPostgres(db.Path()) {
			os.Remove(db.Path())
		}
		runtime.GC()
		b.StartTimer()
	}
	b.ReportMetric(serial.Seconds()/float64(b.N), "serial-s")
	b.ReportMetric(run.Seconds()/float64(b.N), "run-s")
	b.ReportMetric(serial.Seconds()/run.Seconds(), "speedup")
}

// benchDB names a fresh database: a SQLite file in dir, or, where
// pgtest.BenchEnv names a PostgreSQL server, a database on it.
func benchDB(b *testing.B, dir, name string) string {
	if addr, ok := pgtest.BenchAddr(b, "bench_"+name, true); ok {
		return addr
	}
	return filepath.Join(dir, name+".db")
}
