package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/pytorch"
)

func init() {
	register("import", "import a PyTorch memory snapshot (pickle, JSON or gzip), or a job's snapshots as one run, into the database", runImport)
}

func runImport(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("import", stderr)
	name := fs.String("name", "", "trace name (default: the file name, plus the device)")
	dbPath := dbFlag(fs, "")
	device := fs.Int("device", -1, "import only this device (default: every device with a trace or segments)")
	dryRun := fs.Bool("dry-run", false, "decode and check the file, write nothing")
	asJSON := fs.Bool("json", false, "print the figures per device as JSON")
	addr := uiFlag(fs, "")
	run := fs.String("run", "", "import the FILES (a folder: the files in it; a tar: its files) as the ranks of one run of this name, on every core")
	ranks := fs.String("ranks", "", "with --run: the files' ranks in order, as 0,1,2,... (default: from the names, user_metadata, or the files' order)")
	join := fs.Bool("join", false, "with --run: add the files to the newest run of that name that lacks their ranks (made if none), so that a job's ranks imported on several machines make one run")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope import FILE|- [--name N] [--db PATH] [--device N] [--dry-run] [--json]   (-: standard input)")
		fmt.Fprintln(stderr, "       vramscope import --run NAME FILE|FOLDER|TAR... [--ranks 0,1,...] [--join] [--db PATH] [--json]")
		fs.PrintDefaults()
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if *run != "" {
		if flagSet(fs, "device") || *dryRun || *name != "" {
			return usagef("--run imports every device of every file: not with --device, --dry-run or --name")
		}
		return importRun(*run, pos, *ranks, *join, *dbPath, *addr, *asJSON, stdout, stderr)
	}
	if *ranks != "" || *join {
		return usagef("--ranks and --join go with --run")
	}
	if len(pos) != 1 {
		return usagef("want one FILE, got %d arguments (several files are the ranks of a run: --run NAME)", len(pos))
	}
	path := pos[0]
	n := *name
	switch {
	case n != "":
	case path == "-":
		n = "stdin"
	default:
		n = filepath.Base(path)
	}
	if n, err = checkName(n); err != nil {
		return usagef("the trace's name (--name, else the file's): %v", err)
	}
	defer limitMemory([]string{path})()
	f := os.Stdin
	if path != "-" {
		if f, err = os.Open(path); err != nil {
			return inputError{err}
		}
		defer f.Close()
	}
	var r io.Reader = f
	st, err := f.Stat()
	if err == nil && st.IsDir() {
		return usagef("%s is a folder: import --run NAME %s imports its files as the ranks of one run; or name one file", path, path)
	}
	if err == nil && st.Size() > 32<<20 {
		r = &progressReader{r: f, total: st.Size(), w: stderr, name: filepath.Base(path)}
	}
	traces, err := pytorch.Decode(r)
	if p, ok := r.(*progressReader); ok {
		p.done()
	}
	if err != nil {
		return inputError{fmt.Errorf("%s: %w", path, err)}
	}
	chosen, err := pytorch.Devices(traces, *device)
	if err == nil {
		err = ingest.Check(chosen)
	}
	if err != nil {
		return inputError{fmt.Errorf("%s: %w", path, err)}
	}
	out := make([]ingest.DeviceFigures, len(chosen))
	for i, t := range chosen {
		out[i] = ingest.FiguresOf(t)
		for _, m := range t.Mismatches {
			fmt.Fprintf(stderr, "vramscope import: device %d: %v\n", t.Device, &m)
		}
	}
	if !*dryRun && len(chosen) > 0 {
		db, err := openDB(*dbPath)
		if err != nil {
			return err
		}
		defer db.Close()
		ids, err := ingest.Store(context.Background(), db, chosen, n)
		if err != nil {
			return err
		}
		for i, id := range ids {
			out[i].TraceID = id
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"devices": out})
	}
	for _, o := range out {
		printFigures(stdout, o, "", *addr)
	}
	return nil
}

// printFigures prints a device's line of import.
func printFigures(w io.Writer, o ingest.DeviceFigures, prefix, addr string) {
	fmt.Fprintf(w, "%sdevice %d: %d segments, %d blocks, %d events, %d B allocated, %d B reserved, %d OOMs",
		prefix, o.Device, o.Segments, o.Blocks, o.Events, o.Allocated, o.Reserved, o.OOMs)
	if o.Estimated {
		fmt.Fprintf(w, " (%s)", gpu.EstimateNote)
	}
	if o.TraceID != "" {
		fmt.Fprintf(w, ", trace %s: %s/traces/%s", o.TraceID, addr, o.TraceID)
	}
	fmt.Fprintln(w)
}

// runRankJSON is one rank of import --run --json.
type runRankJSON struct {
	Rank    int                    `json:"rank"`
	File    string                 `json:"file"`
	Devices []ingest.DeviceFigures `json:"devices"`
}

// importRun imports files (folders stand for their files) as one run.
func importRun(name string, args []string, rankList string, join bool, dbPath, addr string, asJSON bool, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("--run wants the FILES (or a FOLDER, or a TAR) of its ranks")
	}
	paths, err := ingest.SnapshotFiles(args)
	if err != nil {
		return inputError{err}
	}
	defer limitMemory(paths)()
	var src ingest.RunSource = &runProgress{RunSource: ingest.Files(paths), w: stderr, total: len(paths)}
	tarred, err := openTar(paths)
	if err != nil {
		return err
	}
	if tarred != nil {
		defer tarred.Close()
		src = &runProgress{RunSource: ingest.Tar(tarred, pytorch.Options{}), w: stderr}
	}
	if rankList != "" {
		ranks, err := ingest.ParseRanks(rankList)
		if err != nil {
			return usagef("--ranks: %v", err)
		}
		if tarred == nil && len(ranks) != len(paths) {
			return usagef("--ranks gives %d ranks for %d files", len(ranks), len(paths))
		}
		src = ingest.WithRanks(src, ranks)
	}
	db, err := openDB(dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	importRanks := ingest.Run
	if join {
		importRanks = ingest.JoinRun
	}
	run, got, err := importRanks(context.Background(), db, name, src, pytorch.Options{})
	var ie *ingest.InputError
	if errors.As(err, &ie) {
		return inputError{err}
	}
	if err != nil {
		return err
	}
	out := make([]runRankJSON, len(got))
	for i, r := range got {
		out[i] = runRankJSON{Rank: r.Rank, File: r.Name, Devices: r.Devices}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"run": run, "ranks": out})
	}
	for _, r := range out {
		for _, d := range r.Devices {
			printFigures(stdout, d, fmt.Sprintf("rank %d (%s) ", r.Rank, oneLine(r.File)), addr)
		}
	}
	fmt.Fprintf(stdout, "run %s: %s/runs/%s\n", run, addr, run)
	return nil
}

// openTar opens paths when they are one tar archive (gzipped or not) on
// disk, and returns nil otherwise; a pipe is left unread.
func openTar(paths []string) (io.ReadCloser, error) {
	if len(paths) != 1 {
		return nil, nil
	}
	if st, err := os.Stat(paths[0]); err != nil || !st.Mode().IsRegular() {
		return nil, nil
	}
	f, err := os.Open(paths[0])
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(f, 64<<10)
	if isTar, err := ingest.IsTar(br); err != nil || !isTar {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{br, f}, nil
}

// limitMemory sets the soft memory limit for importing paths, unless the
// GOMEMLIMIT environment variable sets one, and returns what undoes it.
func limitMemory(paths []string) (undo func()) {
	if lim := ingest.MemoryLimit(paths); lim > 0 && os.Getenv("GOMEMLIMIT") == "" {
		old := debug.SetMemoryLimit(lim)
		return func() { debug.SetMemoryLimit(old) }
	}
	return func() {}
}

// runProgress says on w each file of a run once it has been read, and how
// many of the run's files have been.
type runProgress struct {
	ingest.RunSource
	w     io.Writer
	total int
	mu    sync.Mutex
	read  int
}

func (p *runProgress) Next() (ingest.RunFile, error) {
	f, err := p.RunSource.Next()
	if err != nil {
		return f, err
	}
	closeFile := f.Close
	f.Close = func() error {
		p.mu.Lock()
		p.read++
		if p.total > 0 {
			fmt.Fprintf(p.w, "read %s (%d/%d)\n", oneLine(f.Name), p.read, p.total)
		} else { // a tar's files are counted as they come
			fmt.Fprintf(p.w, "read %s (%d)\n", oneLine(f.Name), p.read)
		}
		p.mu.Unlock()
		if closeFile != nil {
			return closeFile()
		}
		return nil
	}
	return f, nil
}

// progressReader prints how far a big file has been read, on stderr.
type progressReader struct {
	r     io.Reader
	w     io.Writer
	name  string
	total int64
	read  int64
	last  time.Time
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.read += int64(n)
	if now := time.Now(); now.Sub(p.last) > 500*time.Millisecond {
		p.last = now
		fmt.Fprintf(p.w, "\rreading %s: %d%%", p.name, p.read*100/p.total)
	}
	return n, err
}

func (p *progressReader) done() {
	if !p.last.IsZero() {
		fmt.Fprintf(p.w, "\rreading %s: done\n", p.name)
	}
}
