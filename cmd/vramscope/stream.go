package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"vramscope/gpu"
	"vramscope/pytorch"
	"vramscope/replay"
	"vramscope/store"
)

// openStream reads a request stream (see requestStream) and settles the
// device it replays on: capacity (a --capacity flag) when given, else what
// the recording says or implies, else defaultCapacity. Of a snapshot of
// several devices it tells stderr which one it took.
func openStream(arg, dbPath string, device int, capacity string, stderr io.Writer) (replay.Stream, error) {
	var given uint64
	if capacity != "" {
		var err error
		if given, err = parseCapacity(capacity); err != nil {
			return replay.Stream{}, err
		}
	}
	s, err := requestStream(arg, dbPath, device, stderr)
	if err != nil {
		return s, err
	}
	s.Use(given, replay.DefaultCapacity)
	return s, nil
}

// parseCapacity reads --capacity, refusing a device too small for one
// segment: "--capacity 16" is 16 bytes, most likely a unit left out.
func parseCapacity(s string) (uint64, error) {
	n, err := gpu.ParseBytes(s)
	if err != nil {
		return 0, usagef("--capacity: %v", err)
	}
	if n < gpu.SmallBuffer {
		return 0, usagef("--capacity %s is %d bytes, less than one %s segment: give a unit, as in 16GiB", s, n, gpu.FormatBytes(gpu.SmallBuffer))
	}
	return n, nil
}

// requestStream reads a request stream from a stored trace id or a file: an
// RMM log or a PyTorch snapshot (one device: see decodeSnapshotDevice).
func requestStream(arg, dbPath string, device int, stderr io.Writer) (replay.Stream, error) {
	if _, err := os.Stat(arg); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return replay.Stream{}, err
		}
		if _, err := os.Stat(dbPath); err != nil && !store.IsPostgres(dbPath) {
			return replay.Stream{}, usagef("%s is neither a file nor a trace (no database at %s)", arg, dbPath)
		}
		db, err := store.Open(dbPath)
		if err != nil {
			return replay.Stream{}, err
		}
		defer db.Close()
		tr, err := db.Trace(arg)
		if err != nil {
			return replay.Stream{}, usagef("%s is neither a file nor a trace in %s", arg, dbPath)
		}
		if device >= 0 && device != tr.DeviceOrdinal {
			return replay.Stream{}, usagef("--device picks a device of a snapshot file; trace %s is device %d (each device of an upload is a trace of its own)", arg, tr.DeviceOrdinal)
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
		if device >= 0 {
			return replay.Stream{}, usagef("--device picks a device of a snapshot file; %s is an RMM log", arg)
		}
		reqs, err := replay.ReadRMM(br)
		if err != nil {
			return replay.Stream{}, inputError{fmt.Errorf("%s: %w", arg, err)}
		}
		return replay.Stream{Requests: reqs}, nil
	}
	t, devices, err := decodeSnapshotDevice(br, device)
	if err != nil {
		return replay.Stream{}, inputError{fmt.Errorf("%s: %w", arg, err)}
	}
	if len(devices) > 1 {
		why := "the first"
		switch {
		case t.OOMs() > 0:
			why = "the one that ran out of memory"
		case len(t.Events) > 0:
			why = "the one with the most events"
		}
		fmt.Fprintf(stderr, "%s: device %d (of %s), %s; --device N picks another\n", arg, t.Device, joinInts(devices), why)
	}
	return replay.FromRecording(t.Recording()), nil
}

// decodeSnapshotDevice decodes a PyTorch snapshot and picks one device's
// trace: the given ordinal, or (device < 0) the first that ran out of
// memory, as an upload opens on it, else the one with the most events, as
// memory_viz does. devices are those it picked from.
func decodeSnapshotDevice(r io.Reader, device int) (t *pytorch.Trace, devices []int, err error) {
	traces, err := pytorch.Decode(r)
	if err != nil {
		return nil, nil, err
	}
	traces, err = pytorch.Devices(traces, device)
	if err != nil {
		return nil, nil, err
	}
	best := traces[0]
	for _, t := range traces[1:] {
		if oom, bestOOM := t.OOMs() > 0, best.OOMs() > 0; oom != bestOOM && oom || oom == bestOOM && len(t.Events) > len(best.Events) {
			best = t
		}
	}
	for _, t := range traces {
		devices = append(devices, t.Device)
	}
	return best, devices, nil
}

// joinInts writes ns as "0, 1 and 2".
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
