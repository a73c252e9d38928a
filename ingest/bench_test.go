package ingest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

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
// a fresh database each time; bytes are the file's.
func BenchmarkImport100MB(b *testing.B) {
	path := testkit.SyntheticSnapshot(b, 450_000)
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(st.Size())
	dir := b.TempDir()
	i := 0
	for b.Loop() {
		b.StopTimer()
		db, err := store.Open(filepath.Join(dir, fmt.Sprintf("import%d.db", i)))
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
		b.StartTimer()
	}
}
