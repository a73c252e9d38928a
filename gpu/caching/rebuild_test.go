package caching

import (
	"fmt"
	"maps"
	"slices"
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
				for _, k := range slices.Sorted(maps.Keys(want)) {
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

// Statistics survive their binary form, and counting resumed from a
// checkpoint of them ends where counting straight through does.
func TestStatCheckpointResumes(t *testing.T) {
	h := runRandom(t, "max_split_size_mb:64", 7, 1500)
	rules := h.a.Config().Rules
	whole := NewStatCounter(gpu.NewLayout(rules), rules)
	half := len(h.rec.events) / 2
	for _, e := range h.rec.events[:half] {
		whole.Apply(e)
	}
	b, err := whole.Stats().AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	var st Stats
	if err := st.UnmarshalBinary(b); err != nil || st != *whole.Stats() {
		t.Fatalf("round trip: %v\n%+v\n%+v", err, st, *whole.Stats())
	}
	if err := st.UnmarshalBinary(b[:len(b)-1]); err == nil {
		t.Fatal("a cut checkpoint decoded")
	}
	resumed := ResumeStatCounter(whole.l.Clone(), rules, st)
	for _, e := range h.rec.events[half:] {
		whole.Apply(e)
		resumed.Apply(e)
	}
	if *resumed.Stats() != *whole.Stats() {
		t.Fatalf("resumed %+v\nstraight %+v", *resumed.Stats(), *whole.Stats())
	}
}
