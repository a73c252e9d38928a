package main

import (
	"fmt"
	"io"
	"os"

	"vramscope/gpu"
	"vramscope/pytorch"
	"vramscope/store"
)

func init() {
	register("export", "write a stored trace as a PyTorch snapshot that pytorch.org/memory_viz opens", runExport)
}

func runExport(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("export", stderr)
	out := fs.String("o", "", "output file (.pickle); - for standard output")
	dbPath := fs.String("db", defaultDB, "SQLite database")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope export TRACE -o FILE.pickle [--db PATH]")
		fs.PrintDefaults()
	}
	pos, err := parseTraceArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || *out == "" {
		return usagef("want one TRACE and -o FILE")
	}
	db, err := store.Open(*dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	t, err := snapshotOf(db, pos[0])
	if err != nil {
		return err
	}
	w := stdout
	if *out != "-" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if err := pytorch.Export(w, t); err != nil {
		return err
	}
	if f, ok := w.(*os.File); ok && f != os.Stdout {
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s: %d events, %d segments; open it at https://pytorch.org/memory_viz\n", *out, len(t.Events), len(t.Final.Segments))
	}
	return nil
}

// snapshotOf reads a stored trace back as a snapshot trace: its final
// layout, its events and the stacks they name.
func snapshotOf(db *store.DB, id string) (*pytorch.Trace, error) {
	tr, err := db.Trace(id)
	if err != nil {
		return nil, usagef("no trace %q in the database", id)
	}
	initial, _, err := db.LayoutAtSeq(id, -1)
	if err != nil {
		return nil, err
	}
	final, _, err := db.LayoutAtSeq(id, tr.LastSeq)
	if err != nil {
		return nil, err
	}
	events, err := db.Events(id, 0, tr.LastSeq+1)
	if err != nil {
		return nil, err
	}
	// Renumber the stacks the trace uses, 1..n, in order of first use.
	ids := map[gpu.StackID]gpu.StackID{}
	var stacks []gpu.Stack
	remap := func(sid gpu.StackID) (gpu.StackID, error) {
		if sid == 0 {
			return 0, nil
		}
		if n, ok := ids[sid]; ok {
			return n, nil
		}
		st, err := db.Stack(id, sid)
		if err != nil {
			return 0, err
		}
		stacks = append(stacks, st)
		ids[sid] = gpu.StackID(len(stacks))
		return ids[sid], nil
	}
	for _, l := range []*gpu.Layout{initial, final} {
		for i := range l.Segments {
			for j := range l.Segments[i].Blocks {
				b := &l.Segments[i].Blocks[j]
				if b.Stack, err = remap(b.Stack); err != nil {
					return nil, err
				}
			}
		}
	}
	for i := range events {
		if events[i].Stack, err = remap(events[i].Stack); err != nil {
			return nil, err
		}
	}
	return &pytorch.Trace{
		Device:   tr.DeviceOrdinal,
		Settings: pytorch.SettingsFromRules(tr.Settings, tr.Rules),
		Final:    final,
		Initial:  initial,
		Events:   events,
		HasTime:  true,
		Stacks:   stacks,
	}, nil
}
