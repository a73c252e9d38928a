package tracer

import (
	"slices"
	"testing"

	"vramscope/gpu"
)

func smallParallel(mode string, ranks int) Parallel {
	return Parallel{Train: smallTrain(), Ranks: ranks, Mode: mode}
}

// The first stage of a pipeline holds the most micro-batches and peaks;
// each stage starts a micro-batch after the stage before it has.
func TestPipelineFirstStagePeaks(t *testing.T) {
	p := smallParallel(PipelineParallel, 4)
	var peaks []int64
	var firstAlloc []int64
	for s := range p.Ranks {
		r := runWorkload(t, p.Rank(s), 16<<30, "")
		if r.err != nil {
			t.Fatalf("stage %d: %v", s, r.err)
		}
		peaks = append(peaks, r.alloc.Stats().AllocatedBytes[0].Peak)
		if got := r.env.Metrics["micro_batches_in_flight"]; got != float64(p.Ranks-s) {
			t.Errorf("stage %d: %v micro-batches in flight, want %d", s, got, p.Ranks-s)
		}
		// the stage's first activation: the embedding or what it received
		for _, e := range r.events {
			if e.Action == gpu.ActionAlloc && e.TimeUS >= pipeStartUS {
				firstAlloc = append(firstAlloc, e.TimeUS)
				break
			}
		}
	}
	if slices.Index(peaks, slices.Max(peaks)) != 0 {
		t.Errorf("peaks by stage %v: stage 0 should peak", peaks)
	}
	for s := 1; s < len(firstAlloc); s++ {
		if firstAlloc[s] <= firstAlloc[s-1] {
			t.Errorf("stage %d starts at %d µs, stage %d at %d µs", s, firstAlloc[s], s-1, firstAlloc[s-1])
		}
	}
}

// Data-parallel ranks differ by their batches: the one with the longest
// sequence peaks.
func TestDataParallelRanksDiffer(t *testing.T) {
	p := smallParallel(DataParallel, 4)
	var peaks []int64
	longest, peakRank := 0, 0
	for r := range p.Ranks {
		w := p.Rank(r).(Train)
		if l := slices.Max(w.SeqLens); l > longest {
			longest, peakRank = l, r
		}
		res := runWorkload(t, w, 16<<30, "")
		if res.err != nil {
			t.Fatal(res.err)
		}
		peaks = append(peaks, res.alloc.Stats().AllocatedBytes[0].Peak)
	}
	if slices.Index(peaks, slices.Max(peaks)) != peakRank {
		t.Errorf("peaks %v: rank %d has the longest batch (%d)", peaks, peakRank, longest)
	}
	if slices.Min(peaks) == slices.Max(peaks) {
		t.Errorf("every rank peaks at %d", peaks[0])
	}
}

func TestParallelCheck(t *testing.T) {
	for _, p := range []Parallel{
		{Train: smallTrain(), Ranks: 0, Mode: DataParallel},
		{Train: smallTrain(), Ranks: 2, Mode: "tp"},
		{Train: smallTrain(), Ranks: 8, Mode: PipelineParallel}, // 4 layers
	} {
		if p.Check() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}
