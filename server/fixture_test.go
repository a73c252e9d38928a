package server

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/store"
)

// xssFrame is a frame name that would run script if shown as HTML.
const xssFrame = `<img src=x onerror=alert(1)>`

// workload drives the real caching allocator on the simulated device into
// a store writer: parameters, then steps of activations freed in reverse,
// small temporaries and a big workspace; every 10 µs of clock per call.
type workload struct {
	Steps  int
	Layers int
	Seed   uint64
	Conf   string
	// Capacity of the simulated device.
	Capacity uint64
}

// makeTrace records w into db and returns the trace id.
func makeTrace(tb testing.TB, db *store.DB, name string, w workload) string {
	tb.Helper()
	id, _, err := record(db, name, w)
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

// record returns the trace id and the allocator's final statistics.
func record(db *store.DB, name string, w workload) (string, caching.Stats, error) {
	cfg, err := caching.ParseConfig(w.Conf)
	if err != nil {
		return "", caching.Stats{}, err
	}
	if w.Capacity == 0 {
		w.Capacity = 40 << 30
	}
	dev := sim.New(w.Capacity, sim.WithName("Simulated GPU"))
	wr, err := db.CreateTrace(gpu.TraceMeta{Name: name, Source: gpu.SourceTrace, DeviceName: dev.Name(),
		Capacity: w.Capacity, Settings: w.Conf}, gpu.NewLayout(cfg.Rules))
	if err != nil {
		return "", caching.Stats{}, err
	}
	var clock int64 = 1_000_000
	a, err := caching.New(dev, cfg, caching.WithSink(wr), caching.WithClock(func() int64 { clock += 10; return clock }))
	if err != nil {
		return "", caching.Stats{}, err
	}
	rng := rand.New(rand.NewPCG(w.Seed, 1))
	stack := func(fn string, line uint64) gpu.StackID {
		return wr.Stack(gpu.Stack{{Name: fn, Filename: "model.py", Line: line}, {Name: "forward", Filename: "train.py", Line: 40},
			{Name: "main", Filename: "train.py", Line: 99}})
	}
	xss := wr.Stack(gpu.Stack{{Name: xssFrame, Filename: `<script>alert(2)</script>.py`, Line: 1}})
	malloc := func(size uint64, st gpu.StackID) uint64 {
		p, err := a.Malloc(size, 0, st)
		if err != nil {
			return 0
		}
		return p
	}
	var params []uint64
	for l := 0; l < w.Layers; l++ {
		params = append(params, malloc(64<<20, stack(fmt.Sprintf("layer%d.weight", l), uint64(10+l))))
	}
	params = append(params, malloc(96<<20, xss))
	for s := 0; s < w.Steps; s++ {
		var acts []uint64
		for l := 0; l < w.Layers; l++ {
			acts = append(acts, malloc(uint64(32+rng.IntN(64))<<20, stack("activation", uint64(200+l))))
			for range 6 {
				if p := malloc(uint64(1+rng.IntN(200))<<10, stack("temp", 300)); p != 0 {
					a.Free(p)
				}
			}
		}
		ws := malloc(512<<20, stack("workspace", 400))
		a.Free(ws)
		for i := len(acts) - 1; i >= 0; i-- {
			if acts[i] != 0 {
				a.Free(acts[i])
			}
		}
		clock += 5000
	}
	for _, p := range params {
		if p != 0 {
			a.Free(p)
		}
	}
	a.EmptyCache()
	a.Flush()
	if err := wr.Close(gpu.StatusComplete); err != nil {
		return "", caching.Stats{}, err
	}
	return wr.ID(), a.Stats(), nil
}
