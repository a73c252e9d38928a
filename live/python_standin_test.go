package live_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/live"
	"vramscope/pytorch"
	"vramscope/server"
	"vramscope/store"
)

// runWatched runs testdata/standin_job.py through python -m
// vramscope_watch with opts, on the stand-in torch (standin_torch.py),
// and returns its output and the blocks live at its end.
func runWatched(t *testing.T, env []string, opts ...string) (string, [][2]uint64) {
	t.Helper()
	py := python(t)
	helper, _ := filepath.Abs("python")
	standin, _ := filepath.Abs("testdata/standin")
	cmd := exec.Command(py, append([]string{"-m", "vramscope_watch"}, opts...)...)
	cmd.Env = append(os.Environ(), append([]string{"PYTHONPATH=" + standin + string(os.PathListSeparator) + helper}, env...)...)
	out, err := cmd.CombinedOutput()
	text := string(out)
	t.Logf("python -m vramscope_watch %s:\n%s", strings.Join(opts, " "), text)
	if err != nil && !strings.Contains(text, "OutOfMemoryError") {
		t.Fatal(err)
	}
	var live [][2]uint64
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "[") {
			json.Unmarshal([]byte(line), &live)
		}
	}
	return text, live
}

func traceIn(t *testing.T, text string) string {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if _, after, ok := strings.Cut(line, "watching live at "); ok {
			return after[strings.LastIndex(after, "/")+1:]
		}
	}
	t.Fatalf("no trace in\n%s", text)
	return ""
}

// liveBlocks is what the stored trace has allocated after its last event.
func liveBlocks(t *testing.T, db *store.DB, tr gpu.Trace) [][2]uint64 {
	t.Helper()
	ls, err := db.LiveAtSeq(tr.ID, tr.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]uint64
	for _, b := range ls.Blocks {
		out = append(out, [2]uint64{b.Addr, b.Size})
	}
	return out
}

// A script run through python -m vramscope_watch, with a ring that keeps
// up (the ring cleared after each read), streams every entry of the job,
// once, in order: 50 steps of 200 allocations, each freed (3 entries
// each), then 100 allocations left live, which the trace ends with.
func TestPythonWatchScriptEveryEntry(t *testing.T) {
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	defer srv.Close()
	text, live := runWatched(t, nil, "--url", srv.URL, "--interval", "0.02", "--duty", "1", "--max-entries", "1000000", "testdata/standin_job.py", "50", "100")
	tr, err := db.Trace(traceIn(t, text))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Status != gpu.StatusComplete || tr.Events != 50*600+100 || tr.Dropped != nil || !strings.HasPrefix(tr.Name, "standin_job.py") {
		t.Fatalf("trace %+v, dropped %+v", tr, tr.Dropped)
	}
	evs, err := db.Events(tr.ID, 0, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range evs {
		want := [3]gpu.Action{gpu.ActionAlloc, gpu.ActionFreeRequested, gpu.ActionFreeCompleted}
		step, k := i/600, i%600
		a := gpu.ActionAlloc
		if step < 50 && k >= 200 {
			a = want[1+(k-200)%2]
		}
		if e.Seq != int64(i) || e.Action != a || e.Stack == 0 {
			t.Fatalf("event %d: %v, want seq %d %s with a stack", i, e, i, a)
		}
	}
	if got := liveBlocks(t, db, tr); fmt.Sprint(got) != fmt.Sprint(live) || len(live) != 100 {
		t.Fatalf("the trace ends with %d blocks live, the job with %d", len(got), len(live))
	}
}

// With a ring far smaller than what the job records between two reads,
// entries are lost: the trace says where and about how many (the
// allocator's counters give the count), its state is brought to the
// job's at each gap, and it ends with the job's state.
func TestPythonWatchLostEntriesSaid(t *testing.T) {
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	defer srv.Close()
	text, live := runWatched(t, nil, "--url", srv.URL, "--interval", "0.02", "--max-entries", "300", "testdata/standin_job.py", "200", "100")
	tr, err := db.Trace(traceIn(t, text))
	if err != nil {
		t.Fatal(err)
	}
	d := tr.Dropped
	if tr.Status != gpu.StatusComplete || d == nil || d.GapCount == 0 || d.Lost == 0 || len(d.Gaps) == 0 {
		t.Fatalf("trace %+v, dropped %+v", tr, d)
	}
	t.Logf("%d events stored, %d gaps, %d entries lost, %d events filled in", tr.Events, d.GapCount, d.Lost, d.Filled)
	// The server finds every gap the helper knew of, and any the
	// helper could not see (entries lost as the ring was cleared).
	if !strings.Contains(text, " gaps in the trace (") {
		t.Errorf("the helper did not say it lost entries")
	}
	// Entries made: 200 steps of 600, then 100. Each gap's filled
	// events stand for lost ones; what was read, and lost, is all.
	if made := int64(200*600 + 100); tr.Events-d.Filled+d.Lost > made || tr.Events-d.Filled+d.Lost < made*9/10 {
		t.Errorf("%d events read and %d lost, of %d made", tr.Events-d.Filled, d.Lost, made)
	}
	for _, g := range d.Gaps {
		if g.Seq != g.AfterSeq+g.Filled+1 || g.Lost == 0 {
			t.Fatalf("gap %+v", g)
		}
	}
	if got := liveBlocks(t, db, tr); fmt.Sprint(got) != fmt.Sprint(live) || len(live) != 100 {
		t.Fatalf("the trace ends with %d blocks live, the job with %d", len(got), len(live))
	}
}

// On out-of-memory only: nothing is streamed; when the job runs out of
// memory, PyTorch's observer writes the snapshot into the folder, named
// with the rank, whole, and it holds the oom; or uploads it, and the
// incident's link is printed.
func TestPythonOnOOM(t *testing.T) {
	dir := t.TempDir()
	text, _ := runWatched(t, []string{"RANK=1", "WORLD_SIZE=2"}, "--on-oom", "--dir", dir, "testdata/standin_job.py", "3", "oom")
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 1 || !strings.Contains(filepath.Base(files[0]), "standin_job-rank1-of-2-") || !strings.HasSuffix(files[0], ".pickle") {
		t.Fatalf("files %v", files)
	}
	if !strings.Contains(text, "snapshot written to "+files[0]) || !strings.Contains(text, "OutOfMemoryError") {
		t.Fatal("the helper did not say where, or the job's own error did not follow")
	}
	traces, err := pytorch.DecodeFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	ooms := 0
	for _, e := range traces[0].Events {
		if e.Action == gpu.ActionOOM {
			ooms++
		}
	}
	if ooms != 1 || len(traces[0].Events) != 3*600+1+682 {
		t.Fatalf("%d entries, %d ooms", len(traces[0].Events), ooms)
	}

	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	defer srv.Close()
	text, _ = runWatched(t, nil, "--on-oom", "--url", srv.URL, "testdata/standin_job.py", "3", "oom")
	all, err := db.Traces()
	if err != nil || len(all) != 1 || all[0].OOMs != 1 || all[0].Source != gpu.SourceSnapshot {
		t.Fatalf("traces %+v, %v", all, err)
	}
	if !strings.Contains(text, "incident: "+srv.URL+"/traces/"+all[0].ID+"/incidents/1") {
		t.Fatal("no incident link")
	}
}

// A read that makes a message over the cap the server sets on one is
// cut to the newest entries that fit; the rest are said to be lost, and
// the trace still ends in the job's state.
func TestPythonWatchMessageCap(t *testing.T) {
	py := python(t)
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	defer srv.Close()
	helper, _ := filepath.Abs("python")
	out, err := exec.Command(py, "testdata/watch_small_messages.py", helper, srv.URL).CombinedOutput()
	t.Logf("driver:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r struct {
		Trace string
		Gaps  int
		Lost  int64
		Live  [][2]uint64
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatal(err)
	}
	tr, err := db.Trace(r.Trace)
	if err != nil {
		t.Fatal(err)
	}
	if r.Gaps == 0 || r.Lost == 0 || tr.Dropped == nil || tr.Dropped.Lost != r.Lost || tr.Dropped.GapCount < r.Gaps {
		t.Fatalf("the helper lost %d entries in %d gaps; the trace says %+v", r.Lost, r.Gaps, tr.Dropped)
	}
	if got := liveBlocks(t, db, tr); fmt.Sprint(got) != fmt.Sprint(r.Live) || len(r.Live) != 10 {
		t.Fatalf("the trace ends with %v live, the job with %v", got, r.Live)
	}
}

// A server that pings often (every half second): a read that finds only
// a ping waiting answers it and goes on, instead of waiting for a message
// that does not come until it sends one (the job was held up for good).
func TestPythonWatchPinged(t *testing.T) {
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0", Live: live.Options{PongWait: time.Second}}).Handler())
	defer srv.Close()
	text, left := runWatched(t, nil, "--url", srv.URL, "--interval", "0.1", "--duty", "1", "--max-entries", "1000000", "testdata/standin_job.py", "1000", "5")
	tr, err := db.Trace(traceIn(t, text))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Status != gpu.StatusComplete || tr.Events != 1000*600+5 || len(left) != 5 {
		t.Fatalf("trace %+v", tr)
	}
}

// Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous id in
// the environment), each rank run through python -m vramscope_watch is a
// rank of one run, named by the rendezvous.
func TestPythonWatchScriptRanks(t *testing.T) {
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	defer srv.Close()
	var runs []string
	for rank := range 2 {
		env := []string{fmt.Sprintf("RANK=%d", rank), "WORLD_SIZE=2", "LOCAL_RANK=0", "TORCHELASTIC_RUN_ID=job7"}
		text, _ := runWatched(t, env, "--url", srv.URL, "testdata/standin_job.py", "3")
		tr, err := db.Trace(traceIn(t, text))
		if err != nil {
			t.Fatal(err)
		}
		of, ok, err := db.RunOf(tr.Upload)
		if err != nil || !ok || of.Name != "job7" || of.Rank != rank || !strings.Contains(tr.Name, fmt.Sprintf("rank %d", rank)) || tr.Events != 3*600 {
			t.Fatalf("rank %d: trace %+v, run %+v %v %v", rank, tr, of, ok, err)
		}
		runs = append(runs, of.ID)
	}
	if r, err := db.Run(runs[0]); err != nil || runs[0] != runs[1] || r.WorldSize != 2 || len(r.Ranks) != 2 {
		t.Fatalf("runs %v: %+v %v", runs, r, err)
	}
}
