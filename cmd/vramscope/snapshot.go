package main

import (
	"fmt"
	"io"

	"vramscope/pytorch"
	"vramscope/tracer"
)

func init() {
	snapshotRequests = func(r io.Reader) ([]tracer.Request, error) {
		t, err := decodeSnapshotDevice(r, -1)
		if err != nil {
			return nil, err
		}
		return tracer.FromEvents(t.Initial, t.Events), nil
	}
}

// decodeSnapshotDevice decodes a PyTorch snapshot and picks one device's
// trace: the given ordinal, or (device < 0) the one with the most events,
// as memory_viz does.
func decodeSnapshotDevice(r io.Reader, device int) (*pytorch.Trace, error) {
	traces, err := pytorch.Decode(r)
	if err != nil {
		return nil, err
	}
	if len(traces) == 0 {
		return nil, fmt.Errorf("the snapshot has no device with segments or events")
	}
	var best *pytorch.Trace
	for _, t := range traces {
		if device >= 0 && t.Device == device {
			return t, nil
		}
		if best == nil || len(t.Events) > len(best.Events) {
			best = t
		}
	}
	if device >= 0 {
		return nil, fmt.Errorf("the snapshot has no device %d", device)
	}
	return best, nil
}
