package replay

import (
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

// TestReal211ReplayExactly: every device trace with allocations recorded
// by PyTorch 2.11 on a real GPU replays, from the layout undone from its
// end, to PyTorch's own events one by one, frames included, and ends in
// the segments it dumped, each in its private pool: the OOM under a
// per-process limit the snapshot does not record, DDP's deferred frees,
// CUDA graph and MemPool pools, expandable segments, C++ frames.
func TestReal211ReplayExactly(t *testing.T) {
	traces := 0
	for _, tr := range realTracesOf(t, "pytorch-2.11") {
		allocs := 0
		for _, e := range tr.Events {
			if e.Action == gpu.ActionAlloc {
				allocs++
			}
		}
		if allocs == 0 {
			continue
		}
		traces++
		t.Run(tr.name, func(t *testing.T) {
			rec := tr.Recording()
			s := FromRecording(rec)
			s.Use(0, DefaultCapacity)
			events, a := replayed(t, s, tr.Initial)
			if other, err := sameEvents(events, tr.Events); err != nil || other != 0 {
				t.Errorf("%s: %v (%d releases with other frames)", s.Capacity, err, other)
			}
			if err := sameLayout(a.Layout(), tr.Final); err != nil {
				t.Errorf("at the end: %v", err)
			}
			for _, sg := range tr.Final.Segments {
				if got, want := a.SegmentPool(sg.Addr), caching.PoolID(rec.Pools[sg.Addr]); got != want {
					t.Errorf("segment %#x in pool %v, recorded in %v", sg.Addr, got, want)
				}
			}
		})
	}
	if traces != 7 {
		t.Errorf("%d device traces with allocations, want the 7 of the 2.11 recordings", traces)
	}
}

// TestReal211Facts: what the replays infer from the 2.11 recordings that
// the snapshots do not say.
func TestReal211Facts(t *testing.T) {
	byName := map[string]realTrace{}
	for _, tr := range realTracesOf(t, "pytorch-2.11") {
		byName[tr.name] = tr
	}
	// The OOM under set_per_process_memory_fraction: the device had 128
	// GiB free; the limit PyTorch kept, 5,297,405,952 B (frag_default.json),
	// lies within the bounds the trace gives, and the replay's is in them.
	frag := FromRecording(byName["frag_default_oom.pickle/device0"].Recording())
	const recordedLimit = 5297405952
	if l := frag.Limit; l.Bytes == 0 || l.Low > recordedLimit || l.High < recordedLimit || l.Bytes < l.Low || l.Bytes > l.High || l.DeviceFree < 100<<30 {
		t.Errorf("frag: limit %+v, want bounds around %d", l, recordedLimit)
	}
	if frag.Capacity.Source != CapacityOOM {
		t.Errorf("frag: %s", frag.Capacity)
	}
	// DDP: the gradient buckets' frees wait for the communication stream.
	ddp := FromRecording(byName["ddp_rank0.pickle/device0"].Recording())
	deferred, done := 0, 0
	for _, r := range ddp.Requests {
		if r.Op == OpFree && r.Deferred {
			deferred++
		}
		if r.Op == OpFreeDone {
			done++
		}
	}
	if deferred != 8 || done != 8 {
		t.Errorf("ddp: %d deferred frees, %d completions; want 8 and 8", deferred, done)
	}
	// Graphs: the capture's pool (1,0) and the MemPool's (0,1) serve
	// their own requests.
	graphs := FromRecording(byName["graphs.pickle/device0"].Recording())
	pools := map[caching.PoolID]int{}
	for _, r := range graphs.Requests {
		if r.Op == OpMalloc {
			pools[r.Pool]++
		}
	}
	if pools[caching.PoolID{1, 0}] == 0 || pools[caching.PoolID{0, 1}] == 0 || pools[caching.PoolID{}] == 0 {
		t.Errorf("graphs: mallocs by pool %v", pools)
	}
	for name, tr := range byName {
		if s := FromRecording(tr.Recording()); name != "frag_default_oom.pickle/device0" && s.Limit.Bytes != 0 {
			t.Errorf("%s: a limit inferred without an OOM: %s", name, s.Limit)
		}
	}
}
