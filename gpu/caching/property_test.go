package caching

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"vramscope/gpu"
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

func TestPropertyRandomSequences(t *testing.T) {
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
		for seed := uint64(1); seed <= 6; seed++ {
			t.Run(fmt.Sprintf("conf%d/seed%d", ci, seed), func(t *testing.T) {
				runRandom(t, conf, seed, 1500)
			})
		}
	}
}

func runRandom(t *testing.T, conf string, seed uint64, steps int) *harness {
	r := rand.New(rand.NewPCG(seed, uint64(len(conf))))
	capacity := uint64(512+r.IntN(1024)) << 20
	h := newHarness(t, capacity, conf)
	type live struct {
		addr   uint64
		stream int64
	}
	var lives []live
	for step := 0; step < steps; step++ {
		switch op := r.IntN(100); {
		case op < 48 || len(lives) == 0:
			stream := int64(r.IntN(3))
			p, err := h.a.Malloc(randomSize(r), stream, gpu.StackID(step%7))
			if err != nil {
				var oom *OutOfMemoryError
				if !errors.As(err, &oom) {
					t.Fatalf("step %d: %v", step, err)
				}
				continue
			}
			lives = append(lives, live{p, stream})
		case op < 92 && len(lives) > 0:
			i := r.IntN(len(lives))
			l := lives[i]
			lives[i] = lives[len(lives)-1]
			lives = lives[:len(lives)-1]
			if r.IntN(8) == 0 {
				other := (l.stream + 1 + int64(r.IntN(2))) % 3
				if r.IntN(2) == 0 {
					h.dev.Hold(other)
				}
				if err := h.a.RecordStream(l.addr, other); err != nil {
					t.Fatal(err)
				}
			}
			if err := h.a.Free(l.addr); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		case op < 96:
			h.dev.Release(int64(r.IntN(3)))
		case op < 98:
			if err := h.a.EmptyCache(); err != nil {
				t.Fatal(err)
			}
		}
		if h.a.Reserved() > capacity {
			t.Fatalf("step %d: reserved %d above capacity %d", step, h.a.Reserved(), capacity)
		}
		if step%250 == 0 {
			h.checkInvariants()
			checkPoolSums(t, &h.a.stats)
		}
	}
	h.checkInvariants()
	checkPoolSums(t, &h.a.stats)
	st := h.a.Stats()
	t.Logf("%d events, %d OOMs, %d segments allocated, %d retries, peak reserved %d MiB",
		h.a.Seq(), st.NumOOMs, st.NumDeviceAlloc, st.NumAllocRetries, st.ReservedBytes[statAll].Peak>>20)
	return h
}

// checkPoolSums: every stat's "all" value is the small pool plus the large pool.
func checkPoolSums(t *testing.T, s *Stats) {
	t.Helper()
	for name, arr := range map[string]*StatArray{"allocation": &s.Allocation, "segment": &s.Segment, "active": &s.Active,
		"inactive_split": &s.InactiveSplit, "allocated_bytes": &s.AllocatedBytes, "reserved_bytes": &s.ReservedBytes,
		"active_bytes": &s.ActiveBytes, "inactive_split_bytes": &s.InactiveSplitBytes, "requested_bytes": &s.RequestedBytes} {
		if arr[statAll].Current != arr[statSmall].Current+arr[statLarge].Current {
			t.Fatalf("%s: all %d != small %d + large %d", name, arr[statAll].Current, arr[statSmall].Current, arr[statLarge].Current)
		}
		if arr[statAll].Current < 0 {
			t.Fatalf("%s negative: %d", name, arr[statAll].Current)
		}
	}
}

// TestInactiveSplitMatchesLayout checks the non-releasable figures against
// the layout: free blocks of split non-expandable segments.
func TestInactiveSplitMatchesLayout(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		h := newHarness(t, 1<<30, "")
		r := rand.New(rand.NewPCG(seed, 9))
		var lives []uint64
		for i := 0; i < 2000; i++ {
			if r.IntN(3) > 0 || len(lives) == 0 {
				if p, err := h.a.Malloc(randomSize(r), 0, 0); err == nil {
					lives = append(lives, p)
				}
			} else {
				j := r.IntN(len(lives))
				h.free(lives[j])
				lives = append(lives[:j], lives[j+1:]...)
			}
		}
		var count, bytes int64
		for _, s := range h.a.Snapshot() {
			if len(s.Blocks) < 2 {
				continue
			}
			for _, b := range s.Blocks {
				if b.State == gpu.BlockFree {
					count++
					bytes += int64(b.Size)
				}
			}
		}
		h.expectStats(map[string]int64{"inactive_split.all.current": count, "inactive_split_bytes.all.current": bytes})
	}
}
