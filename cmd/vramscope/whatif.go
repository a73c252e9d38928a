package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"vramscope/gpu"
	"vramscope/incident"
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
	pos, err := parseTraceArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want one TRACE or FILE, got %d arguments", len(pos))
	}
	stream, err := requestStream(pos[0], *dbPath, *device)
	if err != nil {
		return err
	}
	if *capacity != "" {
		if stream.Capacity, err = gpu.ParseBytes(*capacity); err != nil {
			return usagef("--capacity: %v", err)
		}
		stream.CapacityEstimated = false
	}
	if stream.Capacity == 0 {
		stream.Capacity, _ = gpu.ParseBytes(defaultCapacity)
	}
	table, err := incident.Answer(stream, 0)
	if err != nil {
		return err
	}
	rows := table.Rows
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	fmt.Fprintf(stdout, "%d requests replayed on a simulated %s device\n\n", table.Requests, gpu.FormatBytes(table.Capacity))
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
