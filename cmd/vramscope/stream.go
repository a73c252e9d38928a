package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"vramscope/incident"
	"vramscope/pytorch"
	"vramscope/store"
	"vramscope/tracer"
)

// requestStream reads a request stream, its original allocator settings and
// its device's capacity (0: unknown) from a stored trace id or a file: an RMM
// log or a PyTorch snapshot (one device: the given one, or the busiest).
func requestStream(arg, dbPath string, device int) ([]tracer.Request, string, uint64, error) {
	if _, err := os.Stat(arg); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return nil, "", 0, err
		}
		if _, err := os.Stat(dbPath); err != nil {
			return nil, "", 0, usagef("%s is neither a file nor a trace (no database at %s)", arg, dbPath)
		}
		db, err := store.Open(dbPath)
		if err != nil {
			return nil, "", 0, err
		}
		defer db.Close()
		t, err := db.Trace(arg)
		if err != nil {
			return nil, "", 0, usagef("%s is neither a file nor a trace in %s", arg, dbPath)
		}
		initial, _, err := db.LayoutAtSeq(arg, -1)
		if err != nil {
			return nil, "", 0, err
		}
		events, err := db.Events(arg, 0, t.LastSeq+1)
		if err != nil {
			return nil, "", 0, err
		}
		capacity := t.Capacity
		if capacity == 0 {
			capacity, _ = incident.EstimateCapacity(initial, events)
		}
		return tracer.FromEvents(initial, events), t.Settings, capacity, nil
	}
	f, err := os.Open(arg)
	if err != nil {
		return nil, "", 0, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	if head, _ := br.Peek(6); string(head) == "Thread" {
		reqs, err := tracer.ReadRMM(br)
		if err != nil {
			return nil, "", 0, inputError{fmt.Errorf("%s: %w", arg, err)}
		}
		return reqs, "", 0, nil
	}
	t, err := decodeSnapshotDevice(br, device)
	if err != nil {
		return nil, "", 0, inputError{fmt.Errorf("%s: %w", arg, err)}
	}
	capacity, _ := incident.EstimateCapacity(t.Initial, t.Events)
	return tracer.FromEvents(t.Initial, t.Events), t.Settings.Conf, capacity, nil
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
