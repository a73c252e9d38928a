package store

import (
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"vramscope/internal/pgtest"

	"vramscope/gpu"
)

// Benchmarks run from a clean machine; the large databases they query are
// cached under os.TempDir, keyed by size and format version, because
// building the 10M-event one takes a while.

var (
	benchEventsMu sync.Mutex
	benchEvents   = map[int][]gpu.Event{}
)

func streamOf(n int) []gpu.Event {
	benchEventsMu.Lock()
	defer benchEventsMu.Unlock()
	if evs, ok := benchEvents[n]; ok {
		return evs
	}
	evs := newGen(42, 1000).events(n)
	benchEvents[n] = evs
	return evs
}

func ingest(tb testing.TB, db *DB, evs []gpu.Event) *Writer {
	w, err := db.CreateTrace(testMeta, nil)
	if err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < len(evs); i += 4096 {
		w.Emit(evs[i:min(i+4096, len(evs))])
	}
	if err := w.Close(gpu.StatusComplete); err != nil {
		tb.Fatal(err)
	}
	return w
}

// pgSize is the PostgreSQL database's size on disk, after a checkpoint.
func pgSize(b *testing.B, db *DB) int64 {
	var n int64
	db.w.Exec("CHECKPOINT")
	if err := db.r.QueryRow("SELECT pg_database_size(current_database())").Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// freshBenchDB empties the benchmark database at path (a SQLite file, or a
// PostgreSQL database) and returns it.
func freshBenchDB(b *testing.B, path string) string {
	if IsPostgres(path) {
		u, _ := url.Parse(path)
		addr, _ := pgtest.BenchAddr(b, strings.TrimPrefix(u.Path, "/"), true)
		return addr
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		os.Remove(p)
	}
	return path
}

func fileSize(path string) int64 {
	var n int64
	for _, p := range []string{path, path + "-wal"} {
		if st, err := os.Stat(p); err == nil {
			n += st.Size()
		}
	}
	return n
}

// BenchmarkIngest writes a 1M-event trace per iteration.
func BenchmarkIngest(b *testing.B) {
	const n = 1_000_000
	evs := streamOf(n)
	dir := b.TempDir()
	b.ResetTimer()
	var size int64
	for i := range b.N {
		path := filepath.Join(dir, fmt.Sprintf("ingest%d.db", i))
		addr, pg := pgtest.BenchAddr(b, fmt.Sprintf("bench_ingest%d", i), true)
		if pg {
			path = addr
		}
		db, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		var empty int64
		if pg {
			empty = pgSize(b, db)
		}
		ingest(b, db, evs)
		if pg {
			size = pgSize(b, db) - empty
		}
		db.Close()
		if !pg {
			size = fileSize(path)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(size)/n, "bytes/event")
}

// benchDB opens (building if needed) a database holding one trace of n
// events.
func benchDB(b *testing.B, n int) (*DB, gpu.Trace) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("vramscope-store-bench-v2-%d.db", n))
	if addr, ok := pgtest.BenchAddr(b, fmt.Sprintf("bench_store_v2_%d", n), false); ok {
		path = addr
	}
	if db, err := Open(path); err == nil {
		if ts, err := db.Traces(); err == nil && len(ts) == 1 && ts[0].Events == int64(n) && ts[0].Status == gpu.StatusComplete {
			return db, ts[0]
		}
		db.Close()
	}
	path = freshBenchDB(b, path)
	db, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	g := newGen(42, 1000)
	w, err := db.CreateTrace(testMeta, nil)
	if err != nil {
		b.Fatal(err)
	}
	emitGenerated(b, w, g, n)
	t, err := db.Trace(w.ID())
	if err != nil {
		b.Fatal(err)
	}
	return db, t
}

var benchSizes = []int{100_000, 1_000_000, 10_000_000}

func benchQueries(b *testing.B, fn func(db *DB, t gpu.Trace, rng *rand.Rand) error) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			db, t := benchDB(b, n)
			defer db.Close()
			rng := rand.New(rand.NewPCG(9, 9))
			b.ResetTimer()
			for range b.N {
				if err := fn(db, t, rng); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// window picks a window of random width (1 ms to the whole trace) and place.
func window(t gpu.Trace, rng *rand.Rand) (int64, int64) {
	span := t.LastUS - t.FirstUS
	w := int64(1000)
	for w < span && rng.IntN(3) > 0 {
		w *= 4
	}
	w = min(w, span)
	t0 := t.FirstUS + rng.Int64N(span-w+1)
	return t0, t0 + w
}

func BenchmarkLayoutAt(b *testing.B) {
	benchQueries(b, func(db *DB, t gpu.Trace, rng *rand.Rand) error {
		_, _, err := db.LayoutAt(t.ID, t.FirstUS+rng.Int64N(t.LastUS-t.FirstUS+1))
		return err
	})
}

// BenchmarkLiveAt: the allocations live at a random instant.
func BenchmarkLiveAt(b *testing.B) {
	benchQueries(b, func(db *DB, t gpu.Trace, rng *rand.Rand) error {
		_, err := db.LiveAt(t.ID, t.FirstUS+rng.Int64N(t.LastUS-t.FirstUS+1))
		return err
	})
}

func BenchmarkUsage(b *testing.B) {
	benchQueries(b, func(db *DB, t gpu.Trace, rng *rand.Rand) error {
		t0, t1 := window(t, rng)
		_, err := db.Usage(t.ID, t0, t1, 2000)
		return err
	})
}

// BenchmarkAllocations asks for the allocations at least one pixel tall on
// a 1000-pixel axis of the trace's peak.
func BenchmarkAllocations(b *testing.B) {
	benchQueries(b, func(db *DB, t gpu.Trace, rng *rand.Rand) error {
		t0, t1 := window(t, rng)
		_, err := db.Allocations(t.ID, t0, t1, t.PeakReserved/1000, 20000)
		return err
	})
}

// BenchmarkBands lays out the stacked timeline of a random window over
// 1316 x 270 pixels, at the whole memory range and, every other time, at a
// range of a hundredth of the peak.
func BenchmarkBands(b *testing.B) {
	benchQueries(b, func(db *DB, t gpu.Trace, rng *rand.Rand) error {
		t0, t1 := window(t, rng)
		q := BandsQuery{T0: t0, T1: t1, W: 1316, H: 270}
		if rng.IntN(2) == 0 {
			q.M0 = uint64(rng.Int64N(int64(t.PeakAllocated)))
			q.M1 = q.M0 + t.PeakReserved/100
		}
		_, err := db.Bands(t.ID, q)
		return err
	})
}

// BenchmarkStatsAt rebuilds memory_summary()'s statistics at a random
// instant.
func BenchmarkStatsAt(b *testing.B) {
	benchQueries(b, func(db *DB, t gpu.Trace, rng *rand.Rand) error {
		_, _, err := db.StatsAt(t.ID, t.FirstUS+rng.Int64N(t.LastUS-t.FirstUS+1))
		return err
	})
}

// emitGenerated writes n events of g through w in batches of about 4096
// and closes the trace complete.
func emitGenerated(b *testing.B, w *Writer, g *gen, n int) {
	var batch []gpu.Event
	for written := 0; written < n; {
		batch = batch[:0]
		for len(batch) < 4096 {
			batch = g.next(batch)
		}
		batch = batch[:min(len(batch), n-written)]
		w.Emit(batch)
		written += len(batch)
	}
	if err := w.Close(gpu.StatusComplete); err != nil {
		b.Fatal(err)
	}
}
