package caching

import (
	"fmt"
	"testing"

	"vramscope/gpu"
)

// The statistics rebuilt from the events equal the allocator's own, every
// counter but the two no event records (retries and stream syncs).
func TestStatCounterMatchesAllocator(t *testing.T) {
	confs := []string{
		"",
		"expandable_segments:True",
		"max_split_size_mb:64",
		"roundup_power2_divisions:4",
		"garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
		"expandable_segments:True,max_split_size_mb:40",
	}
	for ci, conf := range confs {
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("conf%d/seed%d", ci, seed), func(t *testing.T) {
				h := runRandom(t, conf, seed, 1500)
				c := NewStatCounter(gpu.NewLayout(h.a.Config().Rules), h.a.Config().Rules)
				for _, e := range h.rec.events {
					c.Apply(e)
				}
				got, want := c.Stats().Flat(), h.a.stats.Flat()
				for _, k := range SortedKeys(want) {
					if k == "num_alloc_retries" || k == "num_sync_all_streams" {
						continue
					}
					if got[k] != want[k] {
						t.Errorf("%s: rebuilt %d, allocator %d", k, got[k], want[k])
					}
				}
			})
		}
	}
}
