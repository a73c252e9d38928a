package replay

import "vramscope/gpu"

// EstimateCapacity guesses a device's capacity from a recording that lacks
// it (PyTorch snapshots do): at the first OOM, what the allocator held plus
// what the driver had free. ok is false without an OOM.
func EstimateCapacity(initial *gpu.Layout, events []gpu.Event) (capacity uint64, ok bool) {
	var tot gpu.Totals
	if initial != nil {
		tot.Reserved = initial.Figures().Reserved
	}
	for i := range events {
		if events[i].Action == gpu.ActionOOM {
			return tot.Reserved + events[i].DeviceFree, true
		}
		tot.Apply(&events[i], false)
	}
	return 0, false
}

// Stream is a request stream with what its recording says of where it ran.
type Stream struct {
	Requests []Request
	// Settings are the allocator settings it was recorded under
	// (PYTORCH_CUDA_ALLOC_CONF syntax; empty: the defaults).
	Settings string
	// Capacity is the device's memory, 0 when unknown; CapacityEstimated
	// says it was inferred (EstimateCapacity) rather than recorded.
	Capacity          uint64
	CapacityEstimated bool
}

// FromRecording turns a recorded event stream into requests, with the
// recording's capacity or, when it has none, an estimate from its OOM.
func FromRecording(rec gpu.Recording) Stream {
	s := Stream{Requests: FromEvents(rec.Initial, rec.Events), Settings: rec.Settings, Capacity: rec.Capacity}
	if s.Capacity == 0 {
		s.Capacity, s.CapacityEstimated = EstimateCapacity(rec.Initial, rec.Events)
	}
	return s
}
