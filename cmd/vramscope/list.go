package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"vramscope/gpu"
	"vramscope/store"
)

func init() {
	register("list", "list the stored traces, newest first: their ids, figures and runs", runList)
}

// listed is one trace as list --json prints it: the trace and, when it is
// a rank of a run, the run.
type listed struct {
	gpu.Trace
	Run *gpu.RunOf `json:"run,omitempty"`
}

func runList(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("list", stderr)
	dbPath := dbFlag(fs, "")
	name := fs.String("name", "", "only the traces whose name (or run's name) holds this text, any case")
	asJSON := fs.Bool("json", false, "print a JSON array")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope list [--db PATH] [--name TEXT] [--json]")
		fs.PrintDefaults()
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	db, err := openStored(*dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	traces, _, err := db.TraceList(store.ListQuery{})
	if err != nil {
		return err
	}
	out := []listed{} // an empty array, not null
	for _, t := range traces {
		l := listed{Trace: t}
		if of, ok, err := db.RunOf(t.Upload); err != nil {
			return err
		} else if ok {
			l.Run = &of
		}
		if want := strings.ToLower(*name); want != "" && !strings.Contains(strings.ToLower(t.Name), want) &&
			(l.Run == nil || !strings.Contains(strings.ToLower(l.Run.Name), want)) {
			continue
		}
		out = append(out, l)
	}
	// A run's ranks together, where its newest trace is, by rank and device.
	first := map[string]int{}
	group := func(l listed) string {
		if l.Run != nil {
			return l.Run.ID
		}
		return l.ID
	}
	for i, l := range out {
		if _, ok := first[group(l)]; !ok {
			first[group(l)] = i
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if ga, gb := first[group(a)], first[group(b)]; ga != gb || a.Run == nil {
			return ga < gb
		}
		if a.Run.Rank != b.Run.Rank {
			return a.Run.Rank < b.Run.Rank
		}
		return a.DeviceOrdinal < b.DeviceOrdinal
	})
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if len(out) == 0 {
		fmt.Fprintf(stderr, "no trace in %s\n", *dbPath)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSOURCE\tSTATUS\tEVENTS\tPEAK ALLOCATED\tPEAK RESERVED\tOOMS\tRUN")
	for _, l := range out {
		run := "–"
		if l.Run != nil {
			run = fmt.Sprintf("%s, rank %d", oneLine(l.Run.Name), l.Run.Rank)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\n", l.ID, oneLine(l.Title()), l.Source, l.Status, l.Events,
			gpu.FormatBytes(l.PeakAllocated), gpu.FormatBytes(l.PeakReserved), l.OOMs, run)
	}
	return tw.Flush()
}
