package attrib_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
	"vramscope/tracer"
)

// The live set at an instant of a long training run: 10M events of the
// GPT-2-XL-sized loop (24 layers, every step annotated), recorded once and
// cached under os.TempDir, keyed by size and version, because recording
// it takes a while.

// trainingDB opens (recording it first if needed) a database with one
// training trace of at least n events.
func trainingDB(b *testing.B, n int) (*store.DB, gpu.Trace) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("vramscope-attrib-bench-v1-%d.db", n))
	if db, err := store.Open(path); err == nil {
		if ts, err := db.Traces(); err == nil && len(ts) == 1 && ts[0].Events >= int64(n) && ts[0].Status == gpu.StatusComplete {
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
	w := tracer.DefaultTrain()
	eps := eventsPerStep(b, w)
	w.Steps = 1 + n/eps + n/eps/20 // steps differ a little: a margin
	cfg, _ := caching.ParseConfig("")
	dev := sim.New(80<<30, sim.WithName("Simulated GPU"))
	wr, err := db.CreateTrace(gpu.TraceMeta{Name: "train 10M", Source: gpu.SourceTrace, DeviceName: dev.Name(), Capacity: 80 << 30}, gpu.NewLayout(cfg.Rules))
	if err != nil {
		b.Fatal(err)
	}
	clk := &tracer.Clock{US: 1_000_000}
	a, err := caching.New(dev, cfg, caching.WithSink(wr), caching.WithClock(clk.Now))
	if err != nil {
		b.Fatal(err)
	}
	if err := tracer.Run(context.Background(), w, &tracer.Env{Alloc: a, Clock: clk, Stacks: wr, Annotations: wr}); err != nil {
		b.Fatal(err)
	}
	if err := wr.Close(gpu.StatusComplete); err != nil {
		b.Fatal(err)
	}
	t, err := db.Trace(wr.ID())
	if err != nil {
		b.Fatal(err)
	}
	return db, t
}

// eventsPerStep counts the events of one step of w (two steps less one).
func eventsPerStep(b *testing.B, w tracer.Train) int {
	count := func(steps int) int {
		w.Steps = steps
		cfg, _ := caching.ParseConfig("")
		n := 0
		clk := &tracer.Clock{}
		a, err := caching.New(sim.New(80<<30), cfg, caching.WithSink(gpu.SinkFunc(func(evs []gpu.Event) { n += len(evs) })), caching.WithClock(clk.Now))
		if err != nil {
			b.Fatal(err)
		}
		if err := tracer.Run(context.Background(), w, &tracer.Env{Alloc: a, Clock: clk}); err != nil {
			b.Fatal(err)
		}
		return n
	}
	return count(2) - count(1)
}

// BenchmarkLive answers /live at a random instant of a 10M-event training
// trace: the live set from its checkpoint, the alloc times, stacks and
// user_metadata of its blocks, their categories, and the tree by first
// user frame. cold reads the trace's regions (its 28k annotations) every
// time, as the first question about a trace does; cached keeps them, as
// the server does between questions.
func BenchmarkLive(b *testing.B) {
	db, t := trainingDB(b, 10_000_000)
	defer db.Close()
	b.Run("cold", func(b *testing.B) {
		benchLive(b, t, func() (*attrib.Categorizer, error) { return attrib.NewCategorizer(db, t.ID) })
	})
	cache := attrib.NewCache(1)
	b.Run("cached", func(b *testing.B) {
		benchLive(b, t, func() (*attrib.Categorizer, error) { return cache.Categorizer(db, t.ID) })
	})
}

func benchLive(b *testing.B, t gpu.Trace, categorizer func() (*attrib.Categorizer, error)) {
	rng := rand.New(rand.NewPCG(9, 9))
	var blocks int
	for range b.N {
		at := t.FirstUS + rng.Int64N(t.LastUS-t.FirstUS+1)
		c, err := categorizer()
		if err != nil {
			b.Fatal(err)
		}
		l, err := c.At(attrib.Instant{TimeUS: at})
		if err != nil {
			b.Fatal(err)
		}
		attrib.Group(l.LiveSet, attrib.ByFrame, attrib.Options{Categories: l.Verdicts, MinBytes: l.Bytes() / 5000})
		blocks += len(l.Blocks)
	}
	b.ReportMetric(float64(blocks)/float64(b.N), "blocks/op")
	b.ReportMetric(float64(t.Events), "events")
}

// BenchmarkAreas answers /categories (the category areas over time, 400
// instants, as the timeline asks in area mode) for the whole of a real
// 22k-event training snapshot and of the 10M-event training trace, the
// categorizer cached as the server keeps it.
func BenchmarkAreas(b *testing.B) {
	b.Run("real22k", func(b *testing.B) {
		db := testkit.OpenDB(b)
		f, err := os.Open(testkit.Snapshot(b, "training_22k_user_metadata.pickle"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		ids, err := ingest.Snapshot(db, f, "train", pytorch.Options{})
		if err != nil {
			b.Fatal(err)
		}
		t, err := db.Trace(ids[0])
		if err != nil {
			b.Fatal(err)
		}
		benchAreas(b, db, t)
	})
	b.Run("train10M", func(b *testing.B) {
		db, t := trainingDB(b, 10_000_000)
		defer db.Close()
		benchAreas(b, db, t)
	})
}

func benchAreas(b *testing.B, db *store.DB, t gpu.Trace) {
	cache := attrib.NewCache(1)
	for b.Loop() {
		c, err := cache.Categorizer(db, t.ID)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Areas(store.BandsQuery{T0: t.FirstUS, T1: t.LastUS + 1, W: 400}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSearchStacks searches the stacks of the 10M-event training
// trace (store.Search, as /search does) for a frame that most allocations
// share and for one that few do: either way the search visits every
// finished allocation and keeps the first 500 matches by seq.
func BenchmarkSearchStacks(b *testing.B) {
	db, t := trainingDB(b, 10_000_000)
	defer db.Close()
	for _, q := range []string{"forward", "optimizer"} {
		b.Run(q, func(b *testing.B) {
			var total int64
			for b.Loop() {
				res, err := db.Search(t.ID, q, 500)
				if err != nil {
					b.Fatal(err)
				}
				total = res.Total
			}
			b.ReportMetric(float64(total), "matches")
		})
	}
}

// BenchmarkStepPeaks answers /steps (the first 2000 steps' peaks) of the
// 10M-event training trace as every trace page asks on load: a first time
// (a fresh categorizer), and again through the cache the server keeps.
func BenchmarkStepPeaks(b *testing.B) {
	db, t := trainingDB(b, 10_000_000)
	defer db.Close()
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			c, err := attrib.NewCategorizer(db, t.ID)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.StepPeaks(0, 2000); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("again", func(b *testing.B) {
		cache := attrib.NewCache(1)
		for b.Loop() {
			c, err := cache.Categorizer(db, t.ID)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.StepPeaks(0, 2000); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStepPeaksLive answers /steps of a live training trace of about
// 1M events as its page reads them while it grows: every read comes after
// more events (a new categorizer), through the cache the server keeps.
// The steps that had ended keep their peaks; only the running one costs
// its events.
func BenchmarkStepPeaksLive(b *testing.B) {
	db := testkit.OpenDB(b)
	w := tracer.DefaultTrain()
	w.Steps = 1_000_000 / eventsPerStep(b, w)
	cfg, _ := caching.ParseConfig("")
	wr, err := db.CreateTrace(gpu.TraceMeta{Name: "live train", Source: gpu.SourceLive, Capacity: 80 << 30}, gpu.NewLayout(cfg.Rules))
	if err != nil {
		b.Fatal(err)
	}
	clk := &tracer.Clock{US: 1_000_000}
	a, err := caching.New(sim.New(80<<30), cfg, caching.WithSink(wr), caching.WithClock(clk.Now))
	if err != nil {
		b.Fatal(err)
	}
	if err := tracer.Run(context.Background(), w, &tracer.Env{Alloc: a, Clock: clk, Stacks: wr, Annotations: wr}); err != nil {
		b.Fatal(err)
	}
	wr.Annotate(gpu.Annotation{TimeUS: clk.Now(), Stage: "START", Name: fmt.Sprintf("ProfilerStep#%d", w.Steps)}) // running
	if err := wr.Flush(); err != nil {
		b.Fatal(err)
	}
	t, _ := db.Trace(wr.ID())
	b.Logf("%d events, %d steps", t.Events, w.Steps+1)
	cache := attrib.NewCache(1)
	for b.Loop() {
		clk.Advance(10)
		p, err := a.Malloc(512, 0, 0)
		if err == nil {
			err = a.Free(p)
		}
		if err != nil {
			b.Fatal(err)
		}
		a.Flush()
		if err := wr.Flush(); err != nil {
			b.Fatal(err)
		}
		c, err := cache.Categorizer(db, wr.ID())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.StepPeaks(0, 2000); err != nil {
			b.Fatal(err)
		}
	}
}
