package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/cuda"
	"vramscope/replay"
	"vramscope/store"
	"vramscope/tracer"
)

func init() {
	register("trace", "run a workload through the caching allocator and record every event", runTrace)
}

// defaultDB is the database of every command when neither --db nor
// $VRAMSCOPE_DB names one: one file per user, wherever the command runs, so
// that `vramscope import` in any folder stores into the database that
// `vramscope` serves. It follows the XDG base directories:
// $XDG_DATA_HOME/vramscope/vramscope.db, else
// ~/.local/share/vramscope/vramscope.db; vramscope.db in the current
// folder when there is no home.
func defaultDB() string {
	data := os.Getenv("XDG_DATA_HOME")
	if !filepath.IsAbs(data) { // the spec says to ignore a relative one
		home, err := os.UserHomeDir()
		if err != nil || home == "" {
			return "vramscope.db"
		}
		data = filepath.Join(home, ".local", "share")
	}
	return filepath.Join(data, "vramscope", "vramscope.db")
}

// dbFlag defines --db: a SQLite file, or a PostgreSQL database that a
// team's servers share; $VRAMSCOPE_DB is its default, else defaultDB. what
// says what the database holds for this command, if anything particular.
func dbFlag(fs *flag.FlagSet, what string) *string {
	def := os.Getenv("VRAMSCOPE_DB")
	if def == "" {
		def = defaultDB()
	}
	if what != "" {
		what = " " + what
	}
	return fs.String("db", def, "database"+what+": a SQLite file, or a PostgreSQL address postgres://USER@HOST/DBNAME that a team's servers share (default $VRAMSCOPE_DB, else $XDG_DATA_HOME/vramscope/vramscope.db, or ~/.local/share/vramscope/vramscope.db)")
}

// uiFlag defines --url: where the UI is served, for the links a command
// prints; usage, if given, says more of them.
func uiFlag(fs *flag.FlagSet, usage string) *string {
	if usage == "" {
		usage = "where the UI is served, for the printed link"
	}
	return fs.String("url", "http://127.0.0.1:8080", usage)
}

// openDB opens (making it if missing) the database at path; the per-user
// default's folder is made too.
func openDB(path string) (*store.DB, error) {
	if path == defaultDB() {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, fmt.Errorf("the database's folder: %w", err)
		}
	}
	return store.Open(path)
}

// incidentPermalink stores a permalink to incident n's page.
func incidentPermalink(db *store.DB, traceID string, n int) (string, error) {
	state, err := json.Marshal(map[string]any{"url": fmt.Sprintf("/traces/%s/incidents/%d", traceID, n), "trace": traceID, "incident": n})
	if err != nil {
		return "", err
	}
	return db.CreatePermalink(traceID, state)
}

func runTrace(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("trace", stderr)
	workload := fs.String("workload", "train", "train, serve-kv, frag or replay (replay takes a FILE)")
	device := fs.String("device", "sim", "sim (simulated) or cuda (the real GPU 0: memory is really taken and touched); with --workload replay, N: the snapshot's device N, on the simulated device")
	capacity := fs.String("capacity", defaultCapacity, "simulated device memory (--device sim); a replay's default is what its recording says or implies")
	conf := fs.String("alloc-conf", "", "allocator settings, PYTORCH_CUDA_ALLOC_CONF syntax")
	dbPath := dbFlag(fs, "")
	name := fs.String("name", "", "trace name (default: the workload and settings)")
	seed := fs.Uint64("seed", 1, "random seed: the same seed gives the same trace")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	addr := uiFlag(fs, "where the UI of --db is served, for the printed link (with --live, the links are the live server's)")
	liveURL := fs.String("live", "", "also stream the events, as they happen, to the vramscope server at this URL; its page is printed at once")
	stepTime := fs.Duration("step-time", 0, "pace the workload so that a person can watch it live: each step (train: a training step; frag: a phase; serve-kv: a decode step) begins no sooner than this after the one before, as in 500ms")
	token := fs.String("token", os.Getenv("VRAMSCOPE_TOKEN"), "the --live server's token (default $VRAMSCOPE_TOKEN)")

	train := tracer.DefaultTrain()
	fs.IntVar(&train.Layers, "layers", train.Layers, "train/serve-kv: transformer layers")
	fs.IntVar(&train.Hidden, "hidden", train.Hidden, "train/serve-kv: hidden size")
	fs.IntVar(&train.Batch, "batch", train.Batch, "train: batch size")
	fs.IntVar(&train.Seq, "seq", train.Seq, "train: sequence length")
	fs.IntVar(&train.Steps, "steps", train.Steps, "train: optimizer steps")
	fs.IntVar(&train.DtypeBytes, "dtype-bytes", train.DtypeBytes, "train/serve-kv: bytes per element (2 for bf16)")
	fs.BoolVar(&train.Checkpointing, "checkpointing", false, "train: activation checkpointing")
	serve := tracer.DefaultServeKV()
	fs.StringVar(&serve.KV, "kv", serve.KV, "serve-kv: KV cache layout, paged or contiguous")
	fs.IntVar(&serve.Requests, "requests", serve.Requests, "serve-kv: requests to serve")
	fs.IntVar(&serve.MaxBatch, "max-batch", serve.MaxBatch, "serve-kv: requests decoded together")
	fs.IntVar(&serve.MaxPrompt, "max-prompt", serve.MaxPrompt, "serve-kv: longest prompt, tokens")
	fs.IntVar(&serve.MaxOutput, "max-output", serve.MaxOutput, "serve-kv: longest output, tokens")
	ranks := fs.Int("ranks", 0, "train: a job of this many ranks (one trace each, stored as one run), run on every core")
	parallel := fs.String("parallel", tracer.PipelineParallel, "with --ranks: pp (pipeline stages, the first holds the most micro-batches) or dp (data parallel, batches of varying length)")
	micro := fs.Int("micro-batches", 0, "with --ranks and pp: micro-batches per step (default: twice the ranks); --batch is a micro-batch's size")
	frag := tracer.DefaultFrag()
	fs.Float64Var(&frag.Fill, "fill", frag.Fill, "frag: share of the device the big tensors fill")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope trace [--workload train|serve-kv|frag|replay FILE] [flags]")
		fs.PrintDefaults()
	}
	pos, err := parseTraceArgs(fs, args)
	if err != nil {
		return err
	}
	var w tracer.Workload
	var rs *replay.Stream
	var capBytes uint64
	switch *workload {
	case "train":
		train.Seed = *seed
		w = train
	case "serve-kv":
		serve.Seed = *seed
		serve.DtypeBytes = train.DtypeBytes
		if fs.Lookup("layers").Value.String() != fmt.Sprint(tracer.DefaultTrain().Layers) {
			serve.Layers = train.Layers
		}
		if fs.Lookup("hidden").Value.String() != fmt.Sprint(tracer.DefaultTrain().Hidden) {
			serve.Hidden = train.Hidden
		}
		w = serve
	case "frag":
		frag.Seed = *seed
		w = frag
	case "replay":
		if len(pos) != 1 {
			return usagef("--workload replay takes one FILE (an RMM log or a PyTorch snapshot) or a stored TRACE id")
		}
		snapDevice := -1
		if n, err := strconv.Atoi(*device); err == nil {
			snapDevice, *device = n, "sim"
		}
		given := ""
		if flagSet(fs, "capacity") {
			given = *capacity
		}
		stream, err := openStream(pos[0], *dbPath, snapDevice, given, stderr)
		if err != nil {
			return err
		}
		pos = nil
		rs = &stream
		capBytes = stream.Capacity.Bytes
		fmt.Fprintf(stderr, "replaying %d requests: %s\n", len(stream.Requests), stream.Capacity)
	default:
		return usagef("unknown --workload %q (train, serve-kv, frag or replay)", *workload)
	}
	if len(pos) > 0 {
		return usagef("unexpected arguments %v", pos)
	}
	// Settings are checked before a trace is made, so a mistake stores nothing.
	if c, ok := w.(interface{ Check() error }); ok {
		if err := c.Check(); err != nil {
			return usagef("%v", err)
		}
	}
	if _, err := caching.ParseConfig(*conf); err != nil {
		return usagef("--alloc-conf: %v", err)
	}
	if *device != "sim" && *device != "cuda" {
		return deviceKindError(*device)
	}
	if rs == nil {
		if capBytes, err = parseCapacity(*capacity); err != nil {
			return err
		}
	}
	var job *tracer.Parallel
	if flagSet(fs, "ranks") {
		job = &tracer.Parallel{Train: train, Ranks: *ranks, Mode: *parallel, MicroBatches: *micro}
		if *workload != "train" {
			return usagef("--ranks runs the train workload, not %s", *workload)
		}
		if err := job.Check(); err != nil {
			return usagef("--ranks: %v", err)
		}
	}
	if *stepTime < 0 {
		return usagef("--step-time %s: a step cannot take less than no time", *stepTime)
	}
	// A live server lists the traces of many runs: the default name says
	// which machine ran this one, and when (a rank's adds its rank first).
	var where string
	if *name == "" {
		*name = *workload
		if job != nil {
			*name += fmt.Sprintf(" %s×%d", job.Mode, job.Ranks)
		}
		if *conf != "" {
			*name += " (" + *conf + ")"
		}
		if *liveURL != "" {
			where = liveNameSuffix(time.Now())
		}
	}
	if *name, err = checkName(*name); err != nil {
		return usagef("--name: %v", err)
	}
	db, err := openDB(*dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var progress io.Writer = stderr
	if *quiet {
		progress = nil
	}
	rec := recording{Name: *name, Workload: w, Replay: rs, Device: *device, Capacity: capBytes, Conf: *conf, Live: *liveURL, Token: *token,
		StepTime: *stepTime}
	if job != nil {
		return recordRun(ctx, db, rec, *job, where, *addr, stdout)
	}
	rec.Name += where
	out := &lockedWriter{w: stdout}
	rec.Announce = func(link string) { fmt.Fprintf(out, "live: %s\n", link) }
	res, err := record(ctx, db, rec, progress)
	if err != nil {
		return err
	}
	t := res.Trace
	fmt.Fprintf(out, "trace %s: %d events, peak reserved %s, peak allocated %s\n", t.ID, t.Events,
		gpu.FormatBytes(t.PeakReserved), gpu.FormatBytes(t.PeakAllocated))
	printTook(out, res.Took, res.Driver)
	for _, n := range res.Notes {
		fmt.Fprintln(out, n)
	}
	for _, o := range res.OOMs {
		fmt.Fprintf(out, "OOM: %s\n", o.Message)
	}
	incidents, err := db.Incidents(t.ID)
	if err != nil {
		return err
	}
	if res.Live != "" {
		// The page a person can open is the live server's; the trace in
		// --db is a copy that its own server would show.
		fmt.Fprintf(out, "%s\n", res.Live)
		for _, in := range incidents {
			fmt.Fprintf(out, "incident %d: %s/incidents/%d\n", in.N, res.Live, in.N)
		}
		return res.Err
	}
	fmt.Fprintf(out, "%s/traces/%s\n", *addr, t.ID)
	for _, in := range incidents {
		token, err := incidentPermalink(db, t.ID, in.N)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "incident %d: %s/p/%s\n", in.N, *addr, token)
	}
	return res.Err
}

// liveNameSuffix tells a live trace's default name from those of other
// runs on one server: " · HOST · the local time it started".
func liveNameSuffix(start time.Time) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown host"
	}
	return " · " + host + " · " + start.Format("2006-01-02 15:04:05")
}

// lockedWriter lets the ranks of a run print lines at once.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// printTook says how long a workload ran and, on a real GPU, how much of
// that the driver calls took, per function, so a slow driver path shows.
func printTook(w io.Writer, took time.Duration, driver []cuda.Call) {
	if len(driver) == 0 {
		fmt.Fprintf(w, "ran for %s\n", short(took))
		return
	}
	var sum time.Duration
	n := 0
	for _, c := range driver {
		sum += c.Time
		n += c.Count
	}
	fmt.Fprintf(w, "ran for %s, %s of it in %d driver calls:\n", short(took), short(sum), n)
	for _, c := range driver {
		fmt.Fprintf(w, "  %-30s %8d× %10s\n", c.Name, c.Count, short(c.Time))
	}
}

// short rounds d to three significant digits: 13.4s, 640ms, 35.2µs.
func short(d time.Duration) time.Duration {
	unit := time.Duration(1)
	for d >= 1000*unit {
		unit *= 10
	}
	return d.Round(unit)
}

// recordRun records every rank of job as one run, ranks in parallel on
// every core, each its own device and trace, and prints a line per rank
// and the run's page. where ends the default names (liveNameSuffix).
func recordRun(ctx context.Context, db *store.DB, rec recording, job tracer.Parallel, where, addr string, stdout io.Writer) error {
	run, err := db.CreateRun(rec.Name+where, job.Ranks)
	if err != nil {
		return err
	}
	out := &lockedWriter{w: stdout}
	results := make([]recorded, job.Ranks)
	errs := make([]error, job.Ranks)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.NumCPU(), job.Ranks) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range next {
				one := rec
				one.Name, one.Workload = fmt.Sprintf("%s rank %d%s", rec.Name, r, where), job.Rank(r)
				one.Run, one.Rank, one.RunName, one.World = run, r, rec.Name+where, job.Ranks
				one.Announce = func(link string) { fmt.Fprintf(out, "rank %d live: %s\n", r, link) }
				results[r], errs[r] = record(ctx, db, one, nil)
				if errs[r] == nil {
					errs[r] = results[r].Err
				}
			}
		}()
	}
	for r := range job.Ranks {
		next <- r
	}
	close(next)
	wg.Wait()
	live := ""
	for r, res := range results {
		if errs[r] != nil {
			fmt.Fprintf(out, "rank %d: %v\n", r, errs[r])
			continue
		}
		t := res.Trace
		fmt.Fprintf(out, "rank %d: trace %s, %d events, peak allocated %s", r, t.ID, t.Events, gpu.FormatBytes(t.PeakAllocated))
		for _, o := range res.OOMs {
			fmt.Fprintf(out, ", OOM: %s", o.Message)
		}
		fmt.Fprintln(out)
		if live == "" {
			live = res.Live
		}
	}
	if live != "" {
		// The run's page on the live server: its id is the server's.
		if page, err := liveRunPage(ctx, rec.Live, live); err == nil {
			fmt.Fprintf(out, "run %s: %s\n", rec.Name+where, page)
		} else {
			fmt.Fprintf(out, "run %s: on the live server, from any rank's page (%v)\n", rec.Name+where, err)
		}
		return errors.Join(errs...)
	}
	fmt.Fprintf(out, "run %s: %s/runs/%s\n", run, addr, run)
	return errors.Join(errs...)
}

// liveRunPage asks the live server at base which run the trace at page
// (a rank's) belongs to, and answers that run's page.
func liveRunPage(ctx context.Context, base, page string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	id := page[strings.LastIndexByte(page, '/')+1:]
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, pageURL(base, "/api/traces/"+url.PathEscape(id)), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var t struct {
		Run *struct {
			ID string `json:"id"`
		} `json:"run"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("the server answered %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&t); err != nil || t.Run == nil {
		return "", fmt.Errorf("the server names no run of trace %s (%v)", id, err)
	}
	return pageURL(base, "/runs/"+url.PathEscape(t.Run.ID)), nil
}
