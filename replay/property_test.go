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

// randomSize mixes the sizes real workloads ask for: tiny tensors, sub-MiB
// small-pool sizes, mid sizes packed into 20 MiB segments, and big ones.
func randomSize(r *rand.Rand) uint64 {
	switch r.IntN(10) {
	case 0, 1, 2:
		return uint64(1 + r.IntN(4096))
	case 3, 4:
		return uint64(1 + r.IntN(1<<20))
	case 5, 6, 7:
		return uint64(1<<20 + r.IntN(9<<20))
	default:
		return uint64(10<<20 + r.IntN(90<<20))
	}
}

// randomRun drives a fresh allocator under conf on a simulated device
// through steps random calls on three streams (mallocs, frees, now and
// then empty_cache() unless under garbage collection) and returns every
// event and the final layout.
func randomRun(t *testing.T, conf string, capacity uint64, seed uint64, steps int) ([]gpu.Event, *gpu.Layout) {
	t.Helper()
	cfg, err := caching.ParseConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	var events []gpu.Event
	a, err := caching.New(sim.New(capacity), cfg, caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { events = append(events, b...) })))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 11))
	// Under garbage collection an empty_cache() right before a malloc that
	// needs a new segment reads like a collection (see inferRuns).
	emptyCache := cfg.GarbageCollectionThreshold == 0
	var live []uint64
	for step := 0; step < steps; step++ {
		switch op := r.IntN(100); {
		case op < 50 || len(live) == 0:
			p, err := a.Malloc(randomSize(r), int64(r.IntN(3)), gpu.StackID(step%5))
			var oom *caching.OutOfMemoryError
			if err != nil && !errors.As(err, &oom) {
				t.Fatal(err)
			}
			if err == nil {
				live = append(live, p)
			}
		case op < 98:
			i := r.IntN(len(live))
			if err := a.Free(live[i]); err != nil {
				t.Fatal(err)
			}
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		case emptyCache:
			if err := a.EmptyCache(); err != nil {
				t.Fatal(err)
			}
		}
	}
	a.Flush()
	return events, a.Layout()
}

// TestPropertyUndoThenReplay: a random run's events, cut anywhere, undone
// from the end to the cut, replay forward from that layout with the
// recorded addresses to the same events and the same end: on every
// setting, with the capacity recorded or (settings whose limits do not
// move with it) inferred from the events alone.
func TestPropertyUndoThenReplay(t *testing.T) {
	confs := []string{
		"",
		"expandable_segments:True",
		"max_split_size_mb:64",
		"roundup_power2_divisions:4",
		"roundup_power2_divisions:[64:8,256:4,>:2],max_split_size_mb:128",
		"garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
		"expandable_segments:True,max_split_size_mb:40",
	}
	for ci, conf := range confs {
		for seed := uint64(1); seed <= 40; seed++ {
			t.Run(fmt.Sprintf("conf%d/seed%d", ci, seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, uint64(ci)))
				capacity := uint64(384+r.IntN(768)) << 20
				events, end := randomRun(t, conf, capacity, seed*7+uint64(ci), 1200)
				cfg, _ := caching.ParseConfig(conf)
				gc := cfg.GarbageCollectionThreshold > 0 && cfg.MemoryFraction > 0
				cut := r.IntN(len(events))
				if seed == 1 || gc {
					// Which cached blocks garbage collection frees depends on
					// how long each has been free, which no layout keeps: a
					// trace under it replays exactly from its very start.
					cut = 0
				}
				// Not between a free_requested and its free_completed: the
				// stream does not know the streams that held the block.
				for cut > 0 && events[cut-1].Action == gpu.ActionFreeRequested {
					cut--
				}
				start := end.Clone()
				for i := len(events) - 1; i >= cut; i-- {
					if err := start.Undo(events[i]); err != nil {
						t.Fatalf("undo event %d: %v", i, err)
					}
				}
				rec := gpu.Recording{Initial: start, Events: events[cut:], Settings: conf, Capacity: capacity}
				if seed%2 == 0 && cfg.MemoryFraction == 0 {
					rec.Capacity = 0 // to be inferred
				}
				s := FromRecording(rec)
				s.Use(0, DefaultCapacity)
				got, a := replayed(t, s, start)
				if _, err := sameEvents(got, events[cut:]); err != nil {
					t.Fatalf("cut at %d of %d, %s, %d segments at the cut: %v", cut, len(events), s.Capacity, len(start.Segments), err)
				}
				if err := sameLayout(a.Layout(), end); err != nil {
					t.Fatalf("at the end: %v", err)
				}
			})
		}
	}
}
