package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"vramscope/gpu"
	"vramscope/incident"
	"vramscope/replay"
)

func init() {
	register("whatif", "replay a trace under other allocator settings: would the OOM have been avoided?", runWhatIf)
}

func runWhatIf(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("whatif", stderr)
	capacity := fs.String("capacity", "", capacityHelp)
	asJSON := fs.Bool("json", false, "print the rows as JSON")
	dbPath := dbFlag(fs, "holding TRACE")
	device := fs.Int("device", -1, deviceHelp)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope whatif TRACE|FILE [--capacity SIZE] [--device N] [--json]")
		fmt.Fprintln(stderr, "TRACE is a stored trace id; FILE is an RMM log or a PyTorch snapshot.")
		fmt.Fprintln(stderr, "Replays it under its recorded settings and under each usual cure for fragmentation: which OOMs each")
		fmt.Fprintln(stderr, "would have served, and the smallest device on which each runs the whole stream.")
		fs.PrintDefaults()
	}
	pos, err := parseTraceArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want one TRACE or FILE, got %d arguments", len(pos))
	}
	stream, err := openStream(pos[0], *dbPath, *device, *capacity, stderr)
	if err != nil {
		return err
	}
	table, err := incident.Answer(stream)
	if err != nil {
		return err
	}
	rows := table.Rows
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	if stream.Estimated {
		fmt.Fprintf(stdout, "the requests were %s\n", gpu.EstimateNote)
	}
	fmt.Fprintf(stdout, "%d requests replayed on a simulated device: %s\n", table.Requests, stream.Capacity)
	if table.Limit != nil {
		fmt.Fprintf(stdout, "under %s\n", table.Limit)
	}
	if table.Contradiction != "" {
		fmt.Fprintf(stdout, "%s\n", table.Contradiction)
	}
	switch len(table.OOMs) {
	case 0:
		fmt.Fprintln(stdout, "no OOM under the recorded settings")
	default:
		var at []string
		for _, o := range table.OOMs {
			at = append(at, fmt.Sprintf("request %d (%s)", o.Index, gpu.FormatBytes(o.Size)))
		}
		fmt.Fprintf(stdout, "original OOMs: %s\n", strings.Join(at, ", "))
	}
	fmt.Fprintln(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTINGS\tOOMS\tSERVED\tNEW OOMS\tPEAK RESERVED\tFRAGMENTATION AT OOM\tMEMORY NEEDED")
	var failed []string
	for i, r := range rows {
		conf := r.AllocConf
		if conf == "" {
			conf = "(defaults)"
		}
		if i == 0 {
			conf += " [original]"
		}
		served, fresh := "-", "-"
		if i > 0 && len(table.OOMs) > 0 {
			served = fmt.Sprintf("%d of %d", len(r.Avoided), len(table.OOMs))
		}
		if i > 0 {
			fresh = fmt.Sprint(len(r.NewOOMs))
		}
		var frag []string
		for _, f := range r.FragmentationAtOOM {
			frag = append(frag, fmt.Sprintf("%.1f%%", 100*f))
		}
		if len(frag) > 3 {
			frag = append(frag[:3], "…")
		}
		need := gpu.FormatBytes(r.CapacityNeeded)
		if r.CapacityNeeded == 0 {
			need = "> " + gpu.FormatBytes(replay.MaxCapacityNeeded)
		}
		ooms, peak := fmt.Sprint(len(r.OOMs)), gpu.FormatBytes(r.PeakReserved)
		if r.Err != "" {
			// The replay stopped: what it counted is not the setting's.
			failed = append(failed, fmt.Sprintf("(*) %s: %s", conf, r.Err))
			conf += " (*)"
			ooms, served, fresh, peak, frag = "-", "-", "-", "-", nil
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", conf, ooms, served, fresh, peak, strings.Join(frag, " "), need)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range failed {
		fmt.Fprintln(stdout, f)
	}
	for k := range table.OOMs {
		f, _ := table.ForOOM(k)
		kind := ""
		if f.Kind != "" {
			kind = " (" + f.Kind + ")"
		}
		fmt.Fprintf(stdout, "\nOOM at request %d%s: %s %s", f.Index, kind, f.Fix, strings.Join(f.Sentences[:len(f.Sentences)-1], " "))
	}
	fmt.Fprintf(stdout, "\n%s\n", table.Needed())
	return nil
}
