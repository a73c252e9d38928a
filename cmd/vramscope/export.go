package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"vramscope/ingest"
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
	device := fs.Int("device", -1, "write only this device of the trace's upload (default: every device)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope export TRACE -o FILE.pickle [--device N] [--db PATH]")
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
	if _, err := db.Trace(pos[0]); err != nil {
		return usagef("no trace %q in the database", pos[0])
	}
	traces, err := ingest.Traces(db, pos[0], *device)
	if errors.Is(err, store.ErrNotFound) {
		return usagef("%v", err)
	}
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
	bw := bufio.NewWriterSize(w, 1<<20)
	if err := pytorch.Export(bw, traces...); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if f, ok := w.(*os.File); ok && f != os.Stdout {
		if err := f.Close(); err != nil {
			return err
		}
		events, segments := 0, 0
		for _, t := range traces {
			events += len(t.Events)
			segments += len(t.Final.Segments)
		}
		fmt.Fprintf(stderr, "wrote %s: %d devices, %d events, %d segments; open it at https://pytorch.org/memory_viz\n", *out, len(traces), events, segments)
	}
	return nil
}
