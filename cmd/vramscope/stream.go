package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"vramscope/gpu"
	"vramscope/pytorch"
	"vramscope/replay"
	"vramscope/store"
)

// openStream reads a request stream (see requestStream) and settles the
// device it replays on: capacity (a --capacity flag) when given, else what
// the recording says or implies, else defaultCapacity.
func openStream(arg, dbPath string, device int, capacity string) (replay.Stream, error) {
	var given uint64
	if capacity != "" {
		var err error
		if given, err = gpu.ParseBytes(capacity); err != nil {
			return replay.Stream{}, usagef("--capacity: %v", err)
		}
	}
	s, err := requestStream(arg, dbPath, device)
	if err != nil {
		return s, err
	}
	s.Use(given, replay.DefaultCapacity)
	return s, nil
}

// requestStream reads a request stream from a stored trace id or a file: an
// RMM log or a PyTorch snapshot (one device: the given one, or the busiest).
func requestStream(arg, dbPath string, device int) (replay.Stream, error) {
	if _, err := os.Stat(arg); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return replay.Stream{}, err
		}
		if _, err := os.Stat(dbPath); err != nil {
			return replay.Stream{}, usagef("%s is neither a file nor a trace (no database at %s)", arg, dbPath)
		}
		db, err := store.Open(dbPath)
		if err != nil {
			return replay.Stream{}, err
		}
		defer db.Close()
		if _, err := db.Trace(arg); err != nil {
			return replay.Stream{}, usagef("%s is neither a file nor a trace in %s", arg, dbPath)
		}
		rec, err := db.Recording(arg)
		if err != nil {
			return replay.Stream{}, err
		}
		return replay.FromRecording(rec), nil
	}
	f, err := os.Open(arg)
	if err != nil {
		return replay.Stream{}, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	if head, _ := br.Peek(6); string(head) == "Thread" {
		reqs, err := replay.ReadRMM(br)
		if err != nil {
			return replay.Stream{}, inputError{fmt.Errorf("%s: %w", arg, err)}
		}
		return replay.Stream{Requests: reqs}, nil
	}
	t, err := decodeSnapshotDevice(br, device)
	if err != nil {
		return replay.Stream{}, inputError{fmt.Errorf("%s: %w", arg, err)}
	}
	return replay.FromRecording(t.Recording()), nil
}

// decodeSnapshotDevice decodes a PyTorch snapshot and picks one device's
// trace: the given ordinal, or (device < 0) the one with the most events,
// as memory_viz does.
func decodeSnapshotDevice(r io.Reader, device int) (*pytorch.Trace, error) {
	traces, err := pytorch.Decode(r)
	if err != nil {
		return nil, err
	}
	traces, err = pytorch.Devices(traces, device)
	if err != nil {
		return nil, err
	}
	best := traces[0]
	for _, t := range traces[1:] {
		if len(t.Events) > len(best.Events) {
			best = t
		}
	}
	return best, nil
}
