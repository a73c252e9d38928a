// Package testkit holds what tests of several rooms need alike: a fresh
// database, a workload recorded into it through the real allocator, and
// spec scenario D. Nothing outside tests imports it.
package testkit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/internal/pgtest"
	"vramscope/internal/testkit/need"
	"vramscope/replay"
	"vramscope/store"
	"vramscope/tracer"
)

// Snapshot is the path of a real snapshot of the older set
// (shared/testdata/pytorch); where it is missing the test fails under
// CI=true and is skipped elsewhere, naming it (need.SnapshotOf).
func Snapshot(tb testing.TB, name string) string {
	tb.Helper()
	return need.SnapshotOf(tb, "pytorch", name)
}

// SnapshotOf is Snapshot in the real set shared/testdata/set
// (pytorch-2.11: today's PyTorch on a real GPU).
func SnapshotOf(tb testing.TB, set, name string) string {
	tb.Helper()
	return need.SnapshotOf(tb, set, name)
}

// RealFiles is every snapshot of the real set (need.RealFiles): a test
// of every real file iterates over it, so that a file added to the set is
// covered without editing the test.
func RealFiles(tb testing.TB, set string) []string {
	tb.Helper()
	return need.RealFiles(tb, set)
}

// MiB is 2^20 bytes.
const MiB = 1 << 20

// EachBackend runs test on SQLite, then on PostgreSQL: DBPath and OpenDB
// give it the database its subtest names.
func EachBackend(t *testing.T, test func(t *testing.T)) {
	t.Run("sqlite", test)
	t.Run("postgres", test)
}

// OnPostgres says whether tb is (within) EachBackend's postgres subtest.
func OnPostgres(tb testing.TB) bool { return strings.Contains(tb.Name()+"/", "/postgres/") }

// DBPath names a fresh database, as --db does: a SQLite file in a
// temporary directory, or, within EachBackend's postgres subtest, a new
// PostgreSQL database (pgtest).
func DBPath(tb testing.TB) string {
	tb.Helper()
	if OnPostgres(tb) {
		return pgtest.Addr(tb)
	}
	return filepath.Join(tb.TempDir(), "test.db")
}

// OpenDB opens a fresh database (DBPath), closed when the test ends.
func OpenDB(tb testing.TB) *store.DB {
	tb.Helper()
	db, err := store.Open(DBPath(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// Record runs w through the caching allocator on a simulated device of
// capacity bytes under conf into db, as `vramscope trace` does, and returns
// the trace id. An OOM ends the run like a real job's. setup, if any, may
// change the workload's environment first (a test's Env.Role hook).
func Record(tb testing.TB, db *store.DB, name string, w tracer.Workload, capacity uint64, conf string, setup ...func(*tracer.Env)) string {
	tb.Helper()
	return record(tb, db, name, "", w, capacity, conf, setup...)
}

// RecordRun records every rank of job as Record does, each rank an upload
// of one run named name, and returns the run's id.
func RecordRun(tb testing.TB, db *store.DB, name string, job tracer.Parallel, capacity uint64) string {
	tb.Helper()
	run, err := db.CreateRun(name, job.Ranks)
	if err != nil {
		tb.Fatal(err)
	}
	for r := range job.Ranks {
		rank := fmt.Sprintf("%s rank %d", name, r)
		up, err := db.CreateUpload(gpu.Upload{Name: rank, Top: "{}", Run: run, Rank: r})
		if err != nil {
			tb.Fatal(err)
		}
		record(tb, db, rank, up, job.Rank(r), capacity, "")
	}
	return run
}

func record(tb testing.TB, db *store.DB, name, upload string, w tracer.Workload, capacity uint64, conf string, setup ...func(*tracer.Env)) string {
	tb.Helper()
	cfg, err := caching.ParseConfig(conf)
	if err != nil {
		tb.Fatal(err)
	}
	dev := sim.New(capacity, sim.WithName("Simulated GPU"))
	wr, err := db.CreateTrace(gpu.TraceMeta{Name: name, Source: gpu.SourceTrace, DeviceName: dev.Name(),
		Capacity: capacity, Settings: cfg.String(), Upload: upload}, gpu.NewLayout(cfg.Rules))
	if err != nil {
		tb.Fatal(err)
	}
	clk := &tracer.Clock{US: 1_000_000}
	a, err := caching.New(dev, cfg, caching.WithSink(wr), caching.WithClock(clk.Now))
	if err != nil {
		tb.Fatal(err)
	}
	env := &tracer.Env{Alloc: a, Clock: clk, Stacks: wr, Annotations: wr}
	for _, f := range setup {
		f(env)
	}
	runErr := tracer.Run(context.Background(), w, env)
	var oom *caching.OutOfMemoryError
	if runErr != nil && !errors.As(runErr, &oom) {
		tb.Fatal(runErr)
	}
	if err := wr.Close(gpu.StatusComplete); err != nil {
		tb.Fatal(err)
	}
	return wr.ID()
}

// Python3 runs a python3 script with the standard library, its arguments
// after it, and returns what it prints. Without python3 the test fails in
// CI and is skipped elsewhere (need.Missing).
func Python3(tb testing.TB, script string, args ...string) []byte {
	tb.Helper()
	py := need.Program(tb, "python3")
	cmd := exec.Command(py, append([]string{"-c", script}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("python3: %v\n%s", err, stderr.String())
	}
	return out
}

// TorchPython is a Python that imports torch, for the tests that run
// scripts through the estimate: python3 on PATH, else /usr/bin/python3
// (Debian's python3-torch). Without one the test fails in CI and is
// skipped elsewhere.
func TorchPython(tb testing.TB) string {
	tb.Helper()
	torchPythonOnce.Do(func() {
		for _, name := range []string{"python3", "/usr/bin/python3", "python"} {
			p, err := exec.LookPath(name)
			if err == nil && exec.Command(p, "-c", "import torch").Run() == nil {
				torchPython = p
				return
			}
		}
	})
	if torchPython == "" {
		need.Missing(tb, "a Python that imports torch (apt-get install python3-torch)")
	}
	return torchPython
}

var (
	torchPythonOnce sync.Once
	torchPython     string
)

// Replaying is a workload that replays reqs, one request per 10 µs.
func Replaying(reqs []replay.Request) tracer.Workload {
	return tracer.WorkloadFunc(func(_ context.Context, env *tracer.Env) error {
		reqs := append([]replay.Request(nil), reqs...)
		for i := range reqs {
			reqs[i].TimeUS = env.Clock.US + int64(i)*10
		}
		_, err := replay.Replay(env.Alloc, reqs, func(t int64) { env.Clock.US = t })
		return err
	})
}

// ScenarioDCapacity is the device of spec scenario D.
const ScenarioDCapacity = 60 * MiB

// ScenarioD is spec §12 D: nine 6 MiB tensors, every other pair freed,
// then 10 MiB on a 60 MiB device, which fails with 36 MiB free in pieces.
func ScenarioD() []replay.Request {
	var reqs []replay.Request
	for i := int64(1); i <= 9; i++ {
		reqs = append(reqs, replay.Request{Op: replay.OpMalloc, ID: i, Size: 6 * MiB})
	}
	for _, i := range []int64{1, 3, 4, 6, 7, 9} {
		reqs = append(reqs, replay.Request{Op: replay.OpFree, ID: i})
	}
	return append(reqs, replay.Request{Op: replay.OpMalloc, ID: 10, Size: 10 * MiB})
}

// RMMLog writes mallocs and frees as an RMM logging_resource_adaptor CSV
// log, one row per request, 1 µs apart.
func RMMLog(reqs []replay.Request) string {
	var b strings.Builder
	b.WriteString("Thread,Time,Action,Pointer,Size,Stream\n")
	sizes := map[int64]uint64{}
	for i, r := range reqs {
		action := "allocate"
		switch r.Op {
		case replay.OpMalloc:
			sizes[r.ID] = r.Size
		case replay.OpFree:
			action = "free"
		default:
			continue
		}
		fmt.Fprintf(&b, "1,10:00:00.%06d,%s,%#x,%d,0x0\n", i, action, 0x7f0000000000+r.ID<<24, sizes[r.ID])
	}
	return b.String()
}

// SyntheticSnapshot returns a synthetic PyTorch snapshot of about events
// trace entries (450k make ~100 MB), made once with python3
// (pytorch/testdata/gen_synthetic.py) and kept in the temp dir, never
// committed. Without python3 the test fails in CI and is skipped elsewhere.
func SyntheticSnapshot(tb testing.TB, events int) string {
	tb.Helper()
	path := filepath.Join(os.TempDir(), fmt.Sprintf("vramscope-synthetic-%d.pickle", events))
	if _, err := os.Stat(path); err == nil {
		return path
	}
	py := need.Program(tb, "python3")
	_, here, _, _ := runtime.Caller(0)
	gen := filepath.Join(filepath.Dir(here), "..", "..", "pytorch", "testdata", "gen_synthetic.py")
	out, err := exec.Command(py, gen, path+".tmp", strconv.Itoa(events)).CombinedOutput()
	if err != nil {
		tb.Fatalf("gen_synthetic.py: %v\n%s", err, out)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		tb.Fatal(err)
	}
	return path
}
