package replay

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
)

// TestPropertyDeferredFreesAndPools: random runs, recorded, undone from
// the end to the start and replayed forward with the recorded addresses,
// give the same events, the same end, and every segment in its pool, under
// default settings and expandable segments, with the capacity recorded or
// inferred. Two kinds of run, on a device they fit: one whose mallocs go
// to the default pools and two private pools, with empty_cache() now and
// then; one where a fifth of the frees wait for another stream, done some
// calls later (or never), as DDP's buckets do. Left out, as the replay
// does not infer them: which pool an OOM was in (an oom entry has no
// address), and the order of several frees completed at once inside a
// malloc's retry or an empty_cache().
func TestPropertyDeferredFreesAndPools(t *testing.T) {
	for _, kind := range []string{"pools", "deferred"} {
		pools := []caching.PoolID{{}}
		if kind == "pools" {
			pools = []caching.PoolID{{}, {}, {}, {1, 0}, {0, 1}}
		}
		for _, conf := range []string{"", "expandable_segments:True"} {
			for seed := uint64(1); seed <= 20; seed++ {
				testDeferredFreesAndPools(t, kind, conf, seed, pools)
			}
		}
	}
}

func testDeferredFreesAndPools(t *testing.T, kind, conf string, seed uint64, pools []caching.PoolID) {
	t.Run(fmt.Sprintf("%s/%q/seed%d", kind, conf, seed), func(t *testing.T) {
		cfg, err := caching.ParseConfig(conf)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(seed, 29))
		const capacity = 64 << 30
		dev := sim.New(capacity)
		var events []gpu.Event
		a, err := caching.New(dev, cfg, caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { events = append(events, b...) })))
		if err != nil {
			t.Fatal(err)
		}
		var live []uint64
		var held []int64 // streams holding deferred frees
		for step := 0; step < 1000; step++ {
			stack := gpu.StackID(1 + step%7)
			switch op := r.IntN(100); {
			case op < 50 || len(live) == 0:
				p, err := a.MallocIn(pools[r.IntN(len(pools))], randomSize(r), int64(r.IntN(2)), stack)
				var oom *caching.OutOfMemoryError
				if err != nil && !errors.As(err, &oom) {
					t.Fatal(err)
				}
				if err == nil {
					live = append(live, p)
				}
			case op < 90:
				i := r.IntN(len(live))
				if kind == "deferred" && r.IntN(5) == 0 {
					s := int64(100 + step)
					dev.Hold(s)
					if err := a.RecordStream(live[i], s); err != nil {
						t.Fatal(err)
					}
					held = append(held, s)
				}
				if err := a.FreeFrom(live[i], stack); err != nil {
					t.Fatal(err)
				}
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
			case op < 98 && len(held) > 0:
				i := r.IntN(len(held))
				dev.Release(held[i])
				held[i] = held[len(held)-1]
				held = held[:len(held)-1]
			case op >= 98 && kind == "pools":
				if err := a.EmptyCacheFrom(stack); err != nil {
					t.Fatal(err)
				}
			}
		}
		a.Flush()
		end := a.Layout()
		start := end.Clone()
		for i := len(events) - 1; i >= 0; i-- {
			if err := start.Undo(events[i]); err != nil {
				t.Fatalf("undo event %d: %v", i, err)
			}
		}
		if len(start.Segments) != 0 {
			t.Fatalf("%d segments before the first event", len(start.Segments))
		}
		rec := gpu.Recording{Initial: start, Events: events, Settings: conf, Capacity: capacity, Pools: map[uint64][2]int64{}}
		if seed%2 == 0 {
			rec.Capacity = 0 // to be inferred
		}
		for _, s := range end.Segments {
			if p := a.SegmentPool(s.Addr); p != (caching.PoolID{}) {
				rec.Pools[s.Addr] = p
			}
		}
		s := FromRecording(rec)
		s.Use(0, DefaultCapacity)
		got, b := replayed(t, s, start)
		if _, err := sameEvents(got, events); err != nil {
			t.Fatalf("%s: %v", s.Capacity, err)
		}
		if err := sameLayout(b.Layout(), end); err != nil {
			t.Fatalf("at the end: %v", err)
		}
		for _, sg := range end.Segments {
			if got, want := b.SegmentPool(sg.Addr), a.SegmentPool(sg.Addr); got != want {
				t.Fatalf("segment %#x in pool %v, recorded in %v", sg.Addr, got, want)
			}
		}
	})
}
