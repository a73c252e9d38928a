package store_test

import (
	"os"
	"path/filepath"
	"testing"

	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
)

// bigRecording opens a database holding the 951,877-event PyTorch 2.11
// recording big.pickle.gz, imported once and kept under os.TempDir (the
// import takes seconds; the benchmark measures the answers).
func bigRecording(b *testing.B) (*store.DB, gpu.Trace) {
	src := testkit.SnapshotOf(b, "pytorch-2.11", "big.pickle.gz")
	path := filepath.Join(os.TempDir(), "vramscope-bands-big-v1.db")
	if db, err := store.Open(path); err == nil {
		if ts, err := db.Traces(); err == nil && len(ts) == 1 && ts[0].Status == gpu.StatusComplete {
			return db, ts[0]
		}
		db.Close()
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		os.Remove(p)
	}
	db, err := store.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(src)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	ids, err := ingest.Snapshot(db, f, filepath.Base(src), pytorch.Options{})
	if err != nil {
		b.Fatal(err)
	}
	t, err := db.Trace(ids[0])
	if err != nil {
		b.Fatal(err)
	}
	return db, t
}

// BenchmarkBandsRecording is the stacked timeline of the whole of a real
// recording (big.pickle.gz, 951,877 events) over 1316 x 270 pixels, as the
// page asks for it when the user presses 0: on the time axis and on the
// event axis.
func BenchmarkBandsRecording(b *testing.B) {
	db, t := bigRecording(b)
	defer db.Close()
	for _, c := range []struct {
		name string
		q    store.BandsQuery
	}{
		{"whole", store.BandsQuery{T0: t.FirstUS, T1: t.LastUS + 1, W: 1316, H: 270}},
		{"whole-events", store.BandsQuery{T0: 0, T1: t.LastSeq + 1, Events: true, W: 1316, H: 270}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := db.Bands(t.ID, c.q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
