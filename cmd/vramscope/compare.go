package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"vramscope/attrib"
	"vramscope/compare"
	"vramscope/gpu"
	"vramscope/incident"
	"vramscope/store"
	"vramscope/web"
)

func init() {
	register("compare", "compare two stored traces: peaks, memory needed, settings, and the live memory by code location where they differ", runCompare)
}

func runCompare(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("compare", stderr)
	asJSON := fs.Bool("json", false, "print the comparison as JSON (what GET /api/compare/A/B answers)")
	align := fs.String("align", "auto", "put the traces on one axis by time, step (ProfilerStep#N starts), event (index) or request (alloc and free requests); auto: by request when both make the same requests, else by time")
	group := fs.String("group", "frame", "group the live memory by frame (first user frame), stack or category")
	rows := fs.Int("rows", compare.DefaultRows, "the rows of each moment's table: the groups that differ most")
	at := fs.Int64("at", 0, "also compare this place of the aligned axis (µs, or an event or request index with --align event or request)")
	wait := fs.Duration("wait", 5*time.Minute, "how long to wait for the what-if replays that find the memory each trace needs")
	dbPath := dbFlag(fs, "")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope compare A B [--json] [--align auto|time|step|event|request] [--group frame|stack|category] [--rows N] [--at X] [--db PATH]")
		fmt.Fprintln(stderr, "A and B are stored trace ids (one may be given as --trace ID; ids that start with - go after --).")
		fmt.Fprintln(stderr, "Prints both traces' peaks and memory needed, their allocator settings, and at each one's peak and where")
		fmt.Fprintln(stderr, "they differ most, the live bytes by code location in A, in B and B − A, largest difference first.")
		fs.PrintDefaults()
	}
	pos, err := parseTraceArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("want two traces, A and B, got %d", len(pos))
	}
	o := compare.Options{Rows: *rows}
	if o.Align, err = compare.ParseAlign(*align); err != nil {
		return usagef("--align: %v", err)
	}
	if o.Group, err = attrib.ParseGrouping(*group); err != nil {
		return usagef("--group: %v", err)
	}
	if *rows < 1 {
		return usagef("--rows %d: want at least 1", *rows)
	}
	if flagSet(fs, "at") {
		o.At = at
	}
	db, err := openStored(*dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, id := range pos {
		if _, err := db.Trace(id); errors.Is(err, store.ErrNotFound) {
			return usagef("no trace %q in %s", id, *dbPath)
		} else if err != nil {
			return err
		}
	}
	o.Needed = compare.FromJobs(incident.NewJobs(db, 2, make(chan struct{}, 1)), *wait)
	res, err := compare.Compare(db, pos[0], pos[1], o)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return printCompare(stdout, res)
}

// signed writes B - A with its sign.
func signed(d int64) string {
	switch {
	case d > 0:
		return "+" + gpu.FormatBytes(uint64(d))
	case d < 0:
		return "-" + gpu.FormatBytes(uint64(-d))
	}
	return "0 B"
}

func printCompare(w io.Writer, r *compare.Result) error {
	for _, s := range []struct {
		name string
		side compare.Side
	}{{"A", r.A}, {"B", r.B}} {
		fmt.Fprintf(w, "%s  %s  %s (%d events, %s)\n", s.name, s.side.ID, oneLine(s.side.Title()), s.side.Events, oneLine(s.side.DeviceName))
		if s.side.Source == gpu.SourceEstimate {
			fmt.Fprintf(w, "   %s\n", gpu.EstimateNote)
		}
		if s.side.SampledEvery > 1 {
			fmt.Fprintf(w, "   compared at a sample: each kept event stands for %d (those with the least and the most bytes)\n", s.side.SampledEvery)
		}
	}
	if r.Note != "" {
		fmt.Fprintf(w, "%s\n\n", r.Note) // it says what the traces are aligned by
	} else {
		fmt.Fprintf(w, "aligned by %s\n\n", r.Align)
	}
	if r.Reading != "" {
		fmt.Fprintf(w, "%s.\n\n", r.Reading)
	}

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tA\tB\tB − A\t")
	var notes []string
	for _, f := range r.Figures {
		a, b, d := gpu.FormatBytes(f.A), gpu.FormatBytes(f.B), signed(f.Delta)
		if f.Key == "memory_needed" {
			a, b = needed(r.A.Needed), needed(r.B.Needed)
		}
		if !f.Known {
			d = "–"
			notes = append(notes, f.Label+": "+f.Note)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", f.Label, a, b, d)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}

	differ := 0
	for _, s := range r.Settings {
		if s.Differs {
			differ++
		}
	}
	fmt.Fprintf(w, "\nallocator settings: %s\n", map[bool]string{true: fmt.Sprintf("%d differ", differ), false: "identical"}[differ > 0])
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range r.Settings {
		mark := " "
		if s.Differs {
			mark = "*"
		}
		fmt.Fprintf(tw, "%s %s\t%s\t%s\n", mark, oneLine(s.Key), oneLine(s.A), oneLine(s.B))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	for _, m := range r.Moments {
		fmt.Fprintf(w, "\n%s (%s): A %s %s · B %s %s · B − A %s\n", m.Label, place(r, m.X),
			gpu.FormatBytes(m.A.Allocated), attrib.AfterEvent(m.A.Seq), gpu.FormatBytes(m.B.Allocated), attrib.AfterEvent(m.B.Seq), signed(m.Divergence))
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "%s\tA\tB\tB − A\n", strings.ToUpper(groupName[r.Group]))
		for _, d := range m.Rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", oneLine(d.Label), gpu.FormatBytes(d.A), gpu.FormatBytes(d.B), signed(d.Delta))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(m.Rows) < m.RowsTotal {
			more, word := m.RowsTotal-len(m.Rows), "groups"
			if more == 1 {
				word = "group"
			}
			fmt.Fprintf(w, "(%d more %s)\n", more, word)
		}
	}
	return nil
}

var groupName = map[attrib.Grouping]string{attrib.ByFrame: "first user frame", attrib.ByStack: "stack", attrib.ByCategory: "category"}

func needed(n compare.Needed) string {
	switch {
	case n.Status != "done":
		return n.Status
	case n.Bytes == 0:
		return "too much"
	}
	return gpu.FormatBytes(n.Bytes)
}

// place writes a place of the aligned axis.
func place(r *compare.Result, x int64) string {
	switch r.Timeline.Unit {
	case "event":
		return fmt.Sprintf("event %d", x)
	case "request":
		return fmt.Sprintf("request %d", x)
	}
	return web.Duration(x) + " in"
}
