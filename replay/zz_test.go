package replay

import (
	"math/rand/v2"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

func setup(t *testing.T, ci int, seed uint64, conf string) (Stream, []gpu.Event, int, *gpu.Layout) {
	r := rand.New(rand.NewPCG(seed, uint64(ci)))
	capacity := uint64(384+r.IntN(768)) << 20
	events, end := randomRun(t, conf, capacity, seed*7+uint64(ci), 1200)
	cut := r.IntN(len(events))
	for cut > 0 && events[cut-1].Action == gpu.ActionFreeRequested {
		cut--
	}
	start := end.Clone()
	for i := len(events) - 1; i >= cut; i-- {
		start.Undo(events[i])
	}
	rec := gpu.Recording{Initial: start, Events: events[cut:], Settings: conf, Capacity: capacity}
	cfg, _ := caching.ParseConfig(conf)
	if seed%2 == 0 && cfg.MemoryFraction == 0 {
		rec.Capacity = 0
	}
	s := FromRecording(rec)
	s.Use(0, DefaultCapacity)
	t.Log("capacity", capacity>>20, "cut", cut, s.Capacity)
	return s, events, cut, start
}

func TestZZ(t *testing.T) {
	conf := "expandable_segments:True,max_split_size_mb:40"
	s, _, _, start := setup(t, 6, 16, conf)
	for _, sg := range start.Segments {
		t.Logf("seg %#x +%d MiB stream %d pool %v first block %d %v", sg.Addr, sg.Size>>20, sg.Stream, sg.Pool, sg.Blocks[0].Size, sg.Blocks[0].State)
	}
	for _, sp := range s.addr.reserves {
		t.Logf("reserve %#x ext %d below %#x", sp.Addr, sp.Size>>20, sp.Below)
	}
	cfg, _ := caching.ParseConfig(conf)
	var evs []gpu.Event
	a, _ := caching.New(s.Device(s.Capacity.Bytes), cfg, caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { evs = append(evs, b...) })))
	s.Start(a)
	a.Flush()
	for _, e := range evs {
		if e.Action != gpu.ActionFreeCompleted {
			t.Log("restore", e)
		}
	}
}
