package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/pytorch"
	"vramscope/store"
)

func init() {
	registerRaw("export", "write a stored trace as a PyTorch snapshot that pytorch.org/memory_viz opens, or its live set at an instant as a pprof profile", runExport)
}

func runExport(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("export", stderr)
	out := fs.String("o", "", "output file (.pickle; .pb.gz with --format pprof); - for standard output")
	dbPath := dbFlag(fs, "")
	device := fs.Int("device", -1, "write only this device of the trace's upload (default: every device)")
	format := fs.String("format", "pickle", "pickle (a PyTorch snapshot) or pprof (the live allocations at an instant)")
	at := fs.Int64("at", 0, "pprof: the instant, in the trace's microseconds (default: the peak of allocated memory)")
	seq := fs.Int64("seq", 0, "pprof: the instant right after event `N` (instead of --at)")
	allFrames := fs.Bool("all-frames", false, "pprof: keep the frames views hide (the allocator's, C++ and CPython's)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope export TRACE -o FILE.pickle [--device N] [--db PATH]")
		fmt.Fprintln(stderr, "       vramscope export TRACE --format pprof [--at T | --seq N] [--all-frames] -o live.pb.gz [--db PATH]")
		fs.PrintDefaults()
	}
	pos, err := parseTraceArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || *out == "" {
		return usagef("want one TRACE and -o FILE")
	}
	switch {
	case *format != "pickle" && *format != "pprof":
		return usagef("--format %q is neither pickle nor pprof", *format)
	case *format == "pickle" && (flagSet(fs, "at") || flagSet(fs, "seq") || *allFrames):
		return usagef("--at, --seq and --all-frames are for --format pprof")
	case *format == "pprof" && flagSet(fs, "device"):
		return usagef("--device is for --format pickle: a pprof profile is one trace's live set")
	case flagSet(fs, "at") && flagSet(fs, "seq"):
		return usagef("give --at or --seq, not both")
	}
	if err := checkOutput(*out); err != nil {
		return err
	}
	db, err := openStored(*dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	tr, err := db.Trace(pos[0])
	if err != nil {
		return usagef("no trace %q in %s", pos[0], *dbPath)
	}
	if *format == "pprof" {
		when := attrib.Instant{BySeq: true, Seq: tr.PeakSeq}
		switch {
		case flagSet(fs, "at"):
			when = attrib.Instant{TimeUS: *at}
		case flagSet(fs, "seq"):
			if *seq < -1 || *seq > tr.LastSeq {
				return usagef("--seq %d is not an event of trace %s (events %d to %d)", *seq, tr.ID, tr.FirstSeq, tr.LastSeq)
			}
			when = attrib.Instant{BySeq: true, Seq: *seq}
		case tr.PeakSeq < 0:
			when.Seq = tr.LastSeq
		}
		return exportProfile(db, tr, when, *allFrames, *out, stdout, stderr)
	}
	traces, err := ingest.Traces(db, pos[0], *device)
	if errors.Is(err, store.ErrNotFound) {
		return usagef("%v", err)
	}
	if err != nil {
		return err
	}
	write := func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<20)
		if err := pytorch.Export(bw, traces...); err != nil {
			return err
		}
		return bw.Flush()
	}
	if *out == "-" {
		return write(stdout)
	}
	if err := writeFile(*out, write); err != nil {
		return err
	}
	events, segments := 0, 0
	var devices []int
	for _, t := range traces {
		events += len(t.Events)
		segments += len(t.Final.Segments)
		devices = append(devices, t.Device)
	}
	word := "devices"
	if len(devices) == 1 {
		word = "device"
	}
	fmt.Fprintf(stderr, "wrote %s: %s %s, %d events, %d segments; open it at https://pytorch.org/memory_viz\n", *out, word, joinInts(devices), events, segments)
	return nil
}

// exportProfile writes the live set of trace tr at an instant as a pprof
// profile to out ("-" for standard output).
func exportProfile(db *store.DB, tr gpu.Trace, when attrib.Instant, all bool, out string, stdout, stderr io.Writer) error {
	l, err := attrib.At(db, tr.ID, when)
	if err != nil {
		return err
	}
	if out == "-" {
		return attrib.WriteProfile(stdout, l, tr, all)
	}
	if err := writeFile(out, func(w io.Writer) error { return attrib.WriteProfile(w, l, tr, all) }); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s: %d live allocations, %d bytes, %s; read it with go tool pprof -top %s\n",
		out, len(l.Blocks), l.Bytes(), attrib.AfterEvent(l.Seq), out)
	return nil
}

// writeFile writes path whole or not at all: into a file beside it,
// renamed over it once write has succeeded, so that a failed export
// leaves no half snapshot behind, nor spoils the file it would replace.
func writeFile(path string, write func(w io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	err = f.Chmod(0o644) // as os.Create would under the usual umask, not CreateTemp's 0600
	if err == nil {
		err = write(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// checkOutput refuses, before any work, an output path that cannot be
// written: a folder, or a file in a folder that does not exist.
func checkOutput(path string) error {
	if path == "-" {
		return nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return usagef("-o %s is a folder: name a file in it", path)
	}
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return usagef("-o %s: the folder %s does not exist: create it (mkdir -p %s), or write elsewhere", path, dir, dir)
	}
	return nil
}

// openStored opens the database of a command that reads stored traces,
// refusing one that does not exist rather than making an empty one.
func openStored(path string) (*store.DB, error) {
	if store.IsPostgres(path) {
		return store.Open(path)
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if path == defaultDB() {
			return nil, usagef("no database at %s yet: vramscope (the server) or vramscope import makes it; or give --db the database that holds the trace", path)
		}
		return nil, usagef("no database at %s: give --db the database that holds the trace", path)
	}
	return store.Open(path)
}
