package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"vramscope/gpu"
	"vramscope/incident"
	"vramscope/store"
	"vramscope/tracer"
)

func init() {
	register("whatif", "replay a trace under other allocator settings: would the OOM have been avoided?", runWhatIf)
}

func runWhatIf(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("whatif", stderr)
	capacity := fs.String("capacity", "", "simulated device memory (default: the trace's device, or an estimate from its OOM, else "+defaultCapacity+")")
	asJSON := fs.Bool("json", false, "print the table as JSON")
	dbPath := fs.String("db", defaultDB, "SQLite database holding TRACE")
	device := fs.Int("device", -1, "snapshot device (default: the one with the most events)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope whatif TRACE|FILE [--capacity SIZE] [--json]")
		fmt.Fprintln(stderr, "TRACE is a stored trace id; FILE is an RMM log or a PyTorch snapshot.")
		fs.PrintDefaults()
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want one TRACE or FILE, got %d arguments", len(pos))
	}
	reqs, conf, capBytes, err := whatIfInput(pos[0], *dbPath, *device)
	if err != nil {
		return err
	}
	if *capacity != "" {
		if capBytes, err = gpu.ParseBytes(*capacity); err != nil {
			return usagef("--capacity: %v", err)
		}
	}
	if capBytes == 0 {
		capBytes, _ = gpu.ParseBytes(defaultCapacity)
	}
	rows, err := incident.WhatIfs(reqs, capBytes, conf, incident.Variants)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	fmt.Fprintf(stdout, "%d requests replayed on a simulated %s device\n\n", len(reqs), gpu.FormatBytes(capBytes))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTINGS\tOOMS\tPEAK RESERVED\tFRAGMENTATION AT OOM\tOOM AVOIDED")
	for i, r := range rows {
		conf := r.AllocConf
		if conf == "" {
			conf = "(defaults)"
		}
		if i == 0 {
			conf += " [original]"
		}
		avoided := "no"
		if r.Avoided {
			avoided = "yes"
		} else if i == 0 || rows[0].OOMs == 0 {
			avoided = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f%%\t%s\n", conf, r.OOMs, gpu.FormatBytes(r.PeakReserved), 100*r.FragmentationAtOOM, avoided)
	}
	return tw.Flush()
}

// whatIfInput reads the request stream, the original settings and the
// capacity (0: unknown) from a stored trace or a file.
func whatIfInput(arg, dbPath string, device int) ([]tracer.Request, string, uint64, error) {
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
