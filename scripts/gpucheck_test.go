package scripts

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"vramscope/internal/testkit"
)

// recordings is ../shared/testdata/pytorch-2.11, and SHARED (the folder
// holding testdata/) for gpu-check.sh.
func recordings(t *testing.T) (dir, shared string) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Dir(testkit.SnapshotOf(t, "pytorch-2.11", "PROVENANCE.md")))
	if err != nil {
		t.Fatal(err)
	}
	return dir, filepath.Dir(filepath.Dir(dir))
}

// run runs a command in the checkout's root with env added; its combined
// output and exit status.
func run(t *testing.T, env []string, name string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
	return string(out), 0
}

func contains(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, out)
		}
	}
}

var (
	prepareOnce sync.Once
	prepared    string // --prepare's folder
	prepareOut  string
	prepareErr  error
)

// prepare runs gpu-check.sh --prepare into a folder of its own, once for
// the package's tests, and returns it (bin/, shared/) and what it printed.
func prepare(t *testing.T) (string, string) {
	t.Helper()
	_, shared := recordings(t)
	prepareOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpu-check-prepared")
		if err != nil {
			prepareErr = err
			return
		}
		cmd := exec.Command("scripts/gpu-check.sh", "--prepare", "--into", dir, shared)
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		prepared, prepareOut = dir, string(out)
		if err != nil {
			prepareErr = fmt.Errorf("gpu-check.sh --prepare: %v\n%s", err, out)
		}
	})
	if prepareErr != nil {
		t.Fatal(prepareErr)
	}
	return prepared, prepareOut
}

func TestMain(m *testing.M) {
	code := m.Run()
	if prepared != "" {
		os.RemoveAll(prepared)
	}
	os.Exit(code)
}

// TestGPUCheckPrepare: --prepare builds the binaries the GPU machine
// cannot (it has no Go), copies the recordings into the ignored shared/,
// says what travels against the device's 64 MiB, prints the one device
// command and its carry list; over the limit it fails saying by how much.
func TestGPUCheckPrepare(t *testing.T) {
	dir, out := prepare(t)
	src, shared := recordings(t)
	for _, b := range []string{"vramscope", "cuda.test", "sim.test", "replay.test"} {
		if fi, err := os.Stat(filepath.Join(dir, "bin", b)); err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("bin/%s: %v, not an executable", b, err)
		}
	}
	build, err := os.ReadFile(filepath.Join(dir, "bin", "BUILD"))
	if err != nil || !regexp.MustCompile(`(?m)^commit \S+\nbuilt \S+ with go`).Match(build) {
		t.Errorf("bin/BUILD: %v %q", err, build)
	}
	// The binaries are the ones the checks call: the test binaries hold
	// the tests they run.
	list, _ := run(t, nil, filepath.Join(dir, "bin", "sim.test"), "-test.list", "TestPlacementAsRecorded")
	contains(t, "sim.test -test.list", list, "TestPlacementAsRecorded")
	list, _ = run(t, nil, filepath.Join(dir, "bin", "replay.test"), "-test.list", "TestFragStreamNeeded$")
	contains(t, "replay.test -test.list", list, "TestFragStreamNeeded")
	list, _ = run(t, nil, filepath.Join(dir, "bin", "cuda.test"), "-test.list", "GPU")
	contains(t, "cuda.test -test.list", list, "TestGPUDevices", "TestGPUExpandablePages")
	if _, status := run(t, nil, filepath.Join(dir, "bin", "vramscope"), "fit", "--help"); status != 0 && status != 2 {
		t.Errorf("bin/vramscope fit --help: status %d", status)
	}
	// The recordings go where the device's tests look for them: the
	// checkout's own shared folder (testkit.SnapshotOf).
	copied := regexp.MustCompile(`(?m)^gpu-check: copying (\S+) into (\S+)$`).FindStringSubmatch(out)
	if copied == nil {
		t.Fatalf("--prepare does not say where the recordings go:\n%s", out)
	}
	within, err := filepath.Rel(dir, filepath.Join(copied[2], "pytorch-2.11"))
	if err != nil || strings.Count(within, string(filepath.Separator)) != 2 || !strings.HasSuffix(within, filepath.Join("testdata", "pytorch-2.11")) {
		t.Errorf("the recordings go to %s, want a folder of %s holding testdata/pytorch-2.11", copied[2], dir)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		a, _ := os.ReadFile(filepath.Join(src, e.Name()))
		b, err := os.ReadFile(filepath.Join(dir, within, e.Name()))
		if err != nil || string(a) != string(b) {
			t.Errorf("%s/%s is not a copy of %s's: %v", within, e.Name(), src, err)
		}
	}
	contains(t, "--prepare's output", out, `command:   scripts/gpu-check.sh --out "$OUT"`, `carry:     ["bin", "shared"]`, "timeout_s: 560")
	m := regexp.MustCompile(`: ([0-9.]+) MiB of 64\.0 MiB that may travel`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("--prepare does not say what travels:\n%s", out)
	}
	var carried int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			carried += fi.Size()
		}
		return nil
	})
	if said, _ := strconv.ParseFloat(m[1], 64); said*(1<<20) < float64(carried) || said > 64 {
		t.Errorf("--prepare says %s MiB travel; bin/ and shared/ alone hold %d B, and 64 MiB is the most", m[1], carried)
	}

	// bin/ and shared/ of the checkout are ignored: they travel as carried
	// paths, never committed.
	if out, status := run(t, nil, "git", "check-ignore", "bin/vramscope", filepath.Join(within, "record.py")); status != 0 {
		t.Errorf("git does not ignore bin/ and shared/ (status %d):\n%s", status, out)
	}

	out, status := run(t, []string{"GPU_CHECK_MAX_CARRY=1048576"}, "scripts/gpu-check.sh", "--prepare", "--into", t.TempDir(), shared)
	if status != 1 {
		t.Errorf("over the limit: status %d, want 1:\n%s", status, out)
	}
	contains(t, "over the limit", out, "over 1.0 MiB: leave something out")
}

// TestGPUCheckRefuses: without a GPU (here), without the recordings, or
// with a check that does not exist, gpu-check.sh stops at once with status
// 2 and says why.
func TestGPUCheckRefuses(t *testing.T) {
	_, shared := recordings(t)
	torch := testkit.TorchPython(t)
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"PyTorch without a GPU", []string{"PYTHON=" + torch}, []string{shared},
			[]string{"gpu-check: no CUDA GPU here: " + torch + ": PyTorch ", "sees no CUDA GPU", "prepare them here with --prepare"}},
		{"no PyTorch", []string{"PYTHON=" + filepath.Join(t.TempDir(), "python3")}, []string{shared},
			[]string{"gpu-check: no CUDA GPU here: "}},
		{"no recordings", nil, []string{t.TempDir()}, []string{"holds no testdata/pytorch-2.11 with record.py and train_default.pickle"}},
		{"no such check", nil, []string{"--only", "estimate,speed", shared}, []string{"--only estimate,speed: no check speed (estimate placement batch cuda live)"}},
		{"a limit of no check", nil, []string{"--limit", "speed=10", shared}, []string{"--limit speed=10: want NAME=SECONDS"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, status := run(t, c.env, "scripts/gpu-check.sh", c.args...)
			if status != 2 {
				t.Errorf("status %d, want 2:\n%s", status, out)
			}
			contains(t, "the refusal", out, c.want...)
			if strings.Contains(out, "== ") {
				t.Errorf("a check ran:\n%s", out)
			}
		})
	}
}

// fakeDriver builds gpu/cuda's fake libcuda.so.1 (it counts calls and
// hands out 2 GiB); the environment that makes the CUDA backend load it.
func fakeDriver(t *testing.T) []string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatal("no C compiler to build the fake driver")
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "libcuda.so.1")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, "../gpu/cuda/testdata/fakecuda.c").CombinedOutput(); err != nil {
		t.Fatalf("building the fake driver: %v\n%s", err, out)
	}
	return []string{"VRAMSCOPE_LIBCUDA=" + lib, "FAKECUDA_COUNTS=" + filepath.Join(dir, "counts")}
}

// fakePython is a python3 that says it sees a GPU when gpu-check.sh asks,
// and holds the live check 30 s, so that its limit stops it.
func fakePython(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "python")
	script := `#!/bin/sh
if [ "$1" = - ]; then cat >/dev/null; echo "Fake GPU, 2147483648 B, PyTorch none, CUDA none"; exit 0; fi
case "$1" in *gpu_live_check.py) sleep 30;; esac
exec python3 "$@"
`
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// tarFiles lists a .tar.gz.
func tarFiles(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	r := tar.NewReader(z)
	for {
		h, err := r.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, strings.TrimPrefix(h.Name, "./"))
	}
}

// TestGPUCheckRun runs gpu-check.sh as on the GPU machine, with the
// prepared binaries, the CUDA backend on the fake driver and a Python that
// says it sees a GPU: the checks run in their order under their limits
// (live, held past its limit, is stopped and said to be), the table of
// verdicts comes last, and --out gets summary.txt, log.txt and
// results.tar.gz with each check's commands and output; a check the
// budget leaves under 30 s for is not run.
func TestGPUCheckRun(t *testing.T) {
	dir, _ := prepare(t)
	_, shared := recordings(t)
	env := append(fakeDriver(t), "PYTHON="+fakePython(t))
	out := t.TempDir()
	got, status := run(t, env, "scripts/gpu-check.sh", "--bin", filepath.Join(dir, "bin"), "--out", out,
		"--only", "live,cuda", "--limit", "live=2", shared)
	if status != 1 {
		t.Errorf("status %d, want 1 (live ran out of time):\n%s", status, got)
	}
	table := got[strings.LastIndex(got, "\ngpu-check: Fake GPU"):]
	for _, row := range []string{`(?m)^CHECK +VERDICT +TIME +LIMIT +SUMMARY$`,
		`(?m)^cuda +ok +\d+s +75s +7 GPU tests passed; frag fragments by default \(ran .*\) and fits with expandable segments`,
		`(?m)^live +TIMEOUT +\d+s +2s +stopped after 2 s`,
		`(?m)^gpu-check: a check failed\n$`} {
		if !regexp.MustCompile(row).MatchString(table) {
			t.Errorf("the table of verdicts lacks %s:\n%s", row, table)
		}
	}
	if i, j := strings.Index(got, "== cuda"), strings.Index(got, "== live"); i < 0 || j < i {
		t.Errorf("cuda does not run before live, in their order of value:\n%s", got)
	}
	summary, err := os.ReadFile(filepath.Join(out, "summary.txt"))
	if err != nil || !strings.HasSuffix(got, string(summary)) {
		t.Errorf("summary.txt (%v) is not the table printed last:\n%s", err, summary)
	}
	log, err := os.ReadFile(filepath.Join(out, "log.txt"))
	if err != nil || string(log) != got {
		t.Errorf("log.txt (%v) is not all that was printed", err)
	}
	files := tarFiles(t, filepath.Join(out, "results.tar.gz"))
	for _, f := range []string{"log.txt", "cuda/output.txt", "cuda/cuda-commands.log", "live/output.txt"} {
		if !strings.Contains(strings.Join(files, "\n")+"\n", f+"\n") {
			t.Errorf("results.tar.gz lacks %s: %v", f, files)
		}
	}
	entries, _ := os.ReadDir(out)
	if len(entries) != 3 {
		t.Errorf("--out holds %d files, want summary.txt, log.txt and results.tar.gz (the device brings back 8 at most)", len(entries))
	}

	got, status = run(t, env, "scripts/gpu-check.sh", "--bin", filepath.Join(dir, "bin"), "--only", "cuda", "--budget", "20", shared)
	if status != 1 || !regexp.MustCompile(`(?m)^cuda +not run +0s +20s +20 s of the --budget left$`).MatchString(got) || strings.Contains(got, "== cuda") {
		t.Errorf("with 20 s of budget: status %d, want 1 and cuda not run:\n%s", status, got)
	}
}

// check runs one of the GPU checks' scripts with python3; its output and
// status, and the verdict line's status word.
func check(t *testing.T, env []string, script string, args ...string) (string, int, string) {
	t.Helper()
	out, status := run(t, env, "python3", append([]string{"scripts/" + script}, args...)...)
	m := regexp.MustCompile(`(?m)^verdict: (ok|FAIL|n/a): .*\n?\z`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("%s prints no verdict last (status %d):\n%s", script, status, out)
	}
	if want := map[string]int{"ok": 0, "FAIL": 1, "n/a": 3}[m[1]]; status != want {
		t.Errorf("%s: verdict %s with status %d", script, m[1], status)
	}
	return out, status, m[1]
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestEstimateCheckTable: the estimate check's table and verdict, given an
// estimate: the real recording itself agrees in every row; a run of
// another model (2 layers, 2 steps) misses both bounds and fails, naming
// them.
func TestEstimateCheckTable(t *testing.T) {
	dir, _ := prepare(t)
	src, _ := recordings(t)
	args := []string{"--vramscope", filepath.Join(dir, "bin", "vramscope"), "--recordings", src, "--work", t.TempDir(), "--estimate"}
	out, _, v := check(t, nil, "gpu_estimate_check.py", append(args, filepath.Join(src, "train_default.pickle"))...)
	if v != "ok" || !regexp.MustCompile(`(?m)^peak allocated +5\.46 GiB +5\.46 GiB +\+0\.00 % +2 % +ok$`).MatchString(out) ||
		!strings.Contains(out, "3552 (100.0 %)") {
		t.Errorf("the recording as its own estimate:\n%s", out)
	}
	out, _, v = check(t, nil, "gpu_estimate_check.py", append(args, filepath.Join(src, "train_stacks_all.pickle"))...)
	if v != "FAIL" || !strings.Contains(out, "verdict: FAIL: peak allocated and memory needed beyond the bound") {
		t.Errorf("another model as the estimate:\n%s", out)
	}
}

// TestPlacementCheckTable: the placement check on ../shared's recordings
// copied in as if made afresh agrees with them row for row; a bisection
// whose probes 2 MiB under the memory needed ran, and a train_default that
// is another job's, fail (the first counts, the second is shown only).
func TestPlacementCheckTable(t *testing.T) {
	dir, _ := prepare(t)
	src, _ := recordings(t)
	fresh := func(t *testing.T, train string, change func(map[string]any)) string {
		rec := t.TempDir()
		copyFile(t, filepath.Join(src, "frag_default_oom.pickle"), filepath.Join(rec, "frag_default_oom.pickle"))
		copyFile(t, filepath.Join(src, train), filepath.Join(rec, "train_default.pickle"))
		copyFile(t, filepath.Join(src, "train_default.json"), filepath.Join(rec, "train_default.json"))
		data, err := os.ReadFile(filepath.Join(src, "frag_default.json"))
		if err != nil {
			t.Fatal(err)
		}
		var facts map[string]any
		if err := json.Unmarshal(data, &facts); err != nil {
			t.Fatal(err)
		}
		change(facts)
		if data, err = json.Marshal(facts); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rec, "frag_default.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return rec
	}
	args := func(rec string) []string {
		return []string{"--recordings", src, "--rec", rec, "--sim-test", filepath.Join(dir, "bin", "sim.test"),
			"--replay-test", filepath.Join(dir, "bin", "replay.test"), "--python", "false", "--limit", "120"}
	}
	out, _, v := check(t, nil, "gpu_placement_check.py", args(fresh(t, "train_default.pickle", func(map[string]any) {}))...)
	for _, row := range []string{
		`(?m)^frag: memory needed \(bisection\) +5,299,503,104 +5,299,503,104 +same$`,
		`(?m)^frag: bisection's probes +14 of 14 as simulated +14 of 14 as simulated +PASS, PASS$`,
		`(?m)^frag_default_oom: cudaMallocs +75 placed, 0 misses, 0 unseen +75 placed, 0 misses, 0 unseen +PASS, PASS$`,
		`(?m)^train_default: cudaMallocs \(shown only\) +49 placed, 0 misses, 2 unseen +49 placed, 0 misses, 2 unseen +PASS, PASS$`} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("copies of ../shared's recordings: no row %s:\n%s", row, out)
		}
	}
	if v != "ok" {
		t.Errorf("copies of ../shared's recordings: verdict %s", v)
	}

	out, _, v = check(t, nil, "gpu_placement_check.py", args(fresh(t, "train_stacks_all.pickle", func(f map[string]any) {
		needed := f["bisect"].(map[string]any)["needed"].(float64)
		for _, p := range f["probes"].([]any) {
			if p := p.(map[string]any); p["limit"].(float64) == needed-2<<20 {
				p["ok"] = true
			}
		}
	}))...)
	contains(t, "a probe that ran where the simulated allocator fails", out,
		"2 of 14 differ: default settings under 5297405952 B: runs false (<nil>), the real allocator true",
		"verdict: FAIL: the fragmenting stream's probes or memory needed not as simulated")
	if v != "FAIL" || !regexp.MustCompile(`(?m)^train_default: cudaMallocs \(shown only\) .* PASS, FAIL$`).MatchString(out) {
		t.Errorf("another job as train_default: verdict %s:\n%s", v, out)
	}
}

// TestBatchCheckTable: the batch check on the tracer's GPT training at
// batch 4, 8 and 16 (exported as snapshots, the real allocator's figures
// standing in by the replay's): predicted exactly, within every bound; a
// peak reserved 8 % off fails its bound, and two DDP ranks that make the
// same requests fail.
func TestBatchCheckTable(t *testing.T) {
	dir, _ := prepare(t)
	src, _ := recordings(t)
	vs := filepath.Join(dir, "bin", "vramscope")
	rec := t.TempDir()
	db := filepath.Join(t.TempDir(), "t.db")
	stats := func(file string) map[string]any {
		out, status := run(t, nil, vs, "replay", file, "--json")
		var r struct{ Stats map[string]any }
		if err := json.Unmarshal([]byte(out), &r); status != 0 || err != nil {
			t.Fatalf("replay %s: %v\n%s", file, err, out)
		}
		return r.Stats
	}
	write := func(name string, v any) {
		data, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(rec, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []struct {
		batch string
		names []string
	}{{"4", []string{"train_b4", "ddp_rank0"}}, {"8", []string{"train_default", "ddp_rank1"}}, {"16", []string{"train_b16"}}} {
		out, status := run(t, nil, vs, "trace", "--workload", "train", "--batch", b.batch, "--steps", "6", "--db", db, "--quiet")
		id := regexp.MustCompile(`(?m)^trace (\S+):`).FindStringSubmatch(out)
		if status != 0 || id == nil {
			t.Fatalf("trace at batch %s: status %d\n%s", b.batch, status, out)
		}
		for _, n := range b.names {
			file := filepath.Join(rec, n+".pickle")
			if out, status := run(t, nil, vs, "export", id[1], "-o", file, "--db", db); status != 0 {
				t.Fatalf("export: %s", out)
			}
			write(n+".json", map[string]any{"memory_stats": stats(file)})
		}
	}
	out, status := run(t, nil, vs, "whatif", filepath.Join(rec, "train_b16.pickle"), "--json")
	var whatif []struct {
		CapacityNeeded uint64 `json:"capacity_needed"`
	}
	if err := json.Unmarshal([]byte(out), &whatif); status != 0 || err != nil || len(whatif) == 0 {
		t.Fatalf("whatif: %v\n%s", err, out)
	}
	write("train_b16_needed.json", map[string]any{"bisect": map[string]any{"needed": whatif[0].CapacityNeeded}})

	args := []string{"--vramscope", vs, "--recordings", src, "--rec", rec, "--python", "false", "--work", t.TempDir(), "--limit", "120"}
	out, _, v := check(t, nil, "gpu_batch_check.py", args...)
	for _, row := range []string{`(?m)^peak allocated +(\S+ GiB) +(\S+ GiB) +(\S+ GiB) \(memory_stats\(\)\) +\+0\.00 % +2 % +ok$`,
		`(?m)^peak reserved .* \+0\.00 % +5 % +ok$`, `(?m)^memory needed .* \(bisection\) +\+0\.00 % +5 % +ok$`,
		`(?m)^requests paired +(\S+) of (\S+) \(100\.0 %\)`, `(?m)^fit +answered$`} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("no row %s:\n%s", row, out)
		}
	}
	if v != "ok" {
		t.Errorf("verdict %s, want ok", v)
	}

	copyFile(t, filepath.Join(rec, "ddp_rank0.pickle"), filepath.Join(rec, "ddp_rank1.pickle"))
	var facts map[string]map[string]float64
	data, _ := os.ReadFile(filepath.Join(rec, "train_b16.json"))
	if err := json.Unmarshal(data, &facts); err != nil {
		t.Fatal(err)
	}
	facts["memory_stats"]["reserved_bytes.all.peak"] *= 1.08
	write("train_b16.json", facts)
	out, _, v = check(t, nil, "gpu_batch_check.py", args...)
	contains(t, "a real peak reserved 8 % higher, and two ranks alike", out, "verdict: FAIL: batch 16's peak reserved predicted -7.41 %",
		"the DDP ranks: ", "make the same requests")
	if v != "FAIL" || !regexp.MustCompile(`(?m)^peak reserved .* -7\.41 % +5 % +FAIL$`).MatchString(out) {
		t.Errorf("verdict %s, want FAIL on peak reserved:\n%s", v, out)
	}
}

// TestCUDACheckTable: the CUDA check on the fake driver passes every GPU
// test and shows frag fragmenting without expandable segments and fitting
// with them, on the "card" as on the simulated device, with the driver's
// calls; where no driver loads, the GPU tests skip, which on a GPU
// machine is a failure.
func TestCUDACheckTable(t *testing.T) {
	dir, _ := prepare(t)
	args := []string{"--vramscope", filepath.Join(dir, "bin", "vramscope"), "--cuda-test", filepath.Join(dir, "bin", "cuda.test"), "--limit", "60"}
	out, _, v := check(t, fakeDriver(t), "gpu_cuda_check.py", append(args, "--work", t.TempDir())...)
	for _, row := range []string{`(?m)^TestGPUExpandablePages +PASS`, `(?m)^default +cuda +OOM +1,075 `, `(?m)^default +sim +OOM +1,075 `,
		`(?m)^expandable +cuda +fit +1,198 .* in 1778 calls$`, `(?m)^expandable +sim +fit +1,198 `, `(?m)^cuMemMap +- +150× `} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("on the fake driver: no row %s:\n%s", row, out)
		}
	}
	if v != "ok" {
		t.Errorf("on the fake driver: verdict %s", v)
	}
	out, _, v = check(t, []string{"VRAMSCOPE_LIBCUDA=" + filepath.Join(t.TempDir(), "libcuda.so.1")}, "gpu_cuda_check.py", append(args, "--work", t.TempDir())...)
	if v != "FAIL" || !regexp.MustCompile(`(?m)^TestGPUDevices +SKIP`).MatchString(out) ||
		!strings.Contains(out, "TestGPUDevices SKIP (no driver found on a GPU machine)") {
		t.Errorf("without a driver: verdict %s:\n%s", v, out)
	}
}

// TestLiveCheck measures as on the GPU, with a stand-in record.py whose
// training steps allocate on live/testdata's stand-in for torch: a real
// vramscope serve, the real watcher, the server's answers read back; the
// table has every phase and what the server holds (timings are not
// judged here). Then --report's verdicts on measurements written out.
func TestLiveCheck(t *testing.T) {
	dir, _ := prepare(t)
	standin, err := filepath.Abs("../live/testdata")
	if err != nil {
		t.Fatal(err)
	}
	rec := t.TempDir()
	script := fmt.Sprintf(`import sys, time
sys.path.insert(0, %q)
import standin_torch
a = standin_torch.install(us_per_entry=0.5)
import torch
torch.__version__ = "stand-in"
torch.cuda.get_device_name = lambda i=0: "stand-in GPU"

def train(steps=5, batch=8, step_times=None, on_step=None, **kw):
    for i in range(steps):
        t0 = time.perf_counter()
        for p in [a.alloc() for _ in range(50)]:
            a.free(p)
        time.sleep(0.002)
        if step_times is not None:
            step_times.append(time.perf_counter() - t0)
        if on_step:
            on_step(i)

def clean():
    pass
`, standin)
	if err := os.WriteFile(filepath.Join(rec, "record.py"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	out, status := run(t, nil, "python3", "scripts/gpu_live_check.py", "--vramscope", filepath.Join(dir, "bin", "vramscope"),
		"--recordings", rec, "--work", work, "--steps", "60", "--limit", "100")
	if status != 0 && status != 1 {
		t.Fatalf("status %d:\n%s", status, out)
	}
	for _, row := range []string{`(?m)^alone \(before and after\) +116 `, `(?m)^recording history \(Python frames\) +58 `,
		`(?m)^watched, sampled +58 .* 1\.05 +(ok|FAIL)$`, `(?m)^entries the server holds of those the job made +[0-9,]+ of [0-9,]+ \(`,
		`(?m)^_snapshot\(\) of the ring, Python frames .* for 9,000 entries`, `(?m)^verdict: (ok|FAIL): watched steps`} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("no row %s:\n%s", row, out)
		}
	}
	var m map[string]any
	data, err := os.ReadFile(filepath.Join(work, "live.json"))
	if err == nil {
		err = json.Unmarshal(data, &m)
	}
	if err != nil || m["trace"] == nil || m["server_trace"] == nil {
		t.Fatalf("live.json: %v, no trace read back: %v", err, m)
	}

	steps := func(n int, ms float64) []float64 {
		s := make([]float64, n)
		for i := range s {
			s[i] = ms / 1000
		}
		return s
	}
	base := map[string]any{"steps": 30, "alone": steps(30, 40), "alone_after": steps(30, 40), "recording": steps(30, 41),
		"snapshot_s": 0.01, "snapshot_entries": 10000, "held_s": 0.02, "trace": "x",
		"server_trace": map[string]any{"events": 9000, "dropped": map[string]any{"lost": 1000, "filled": 10, "gap_count": 3}}}
	completeSteps := func(whole ...int) map[string]any {
		var s []map[string]any
		for i := range 30 {
			s = append(s, map[string]any{"step": i, "complete": slices.Contains(whole, i)})
		}
		return map[string]any{"sampled": true, "steps": s}
	}
	for _, c := range []struct {
		name    string
		change  map[string]any
		verdict string
		want    []string
	}{
		{"no complete()", map[string]any{"watched": steps(30, 41), "can_complete": false}, "ok",
			[]string{"8,990 of 9,990 (90.0 %), 3 gaps", "n/a: this vramscope_watch has no complete(N)", "verdict: ok: watched steps 1.025 of alone's"}},
		{"watched 10 % slower", map[string]any{"watched": steps(30, 44), "can_complete": false}, "FAIL",
			[]string{"verdict: FAIL: watched steps 1.100 of alone's, over 1.05"}},
		{"ten steps whole", map[string]any{"watched": append(steps(10, 40), append(steps(10, 46), steps(10, 40)...)...),
			"can_complete": true, "asked_after": 10, "server_steps": completeSteps(10, 11, 12, 13, 14, 15, 16, 17, 18, 19)}, "ok",
			[]string{"asked 10 after step 10: 10 complete (10, 11, 12, 13, 14, 15, 16, 17, 18, 19)", "+6.00 ms against alone",
				"verdict: ok: watched steps 1.000 of alone's; 10 steps read whole"}},
		{"two steps whole", map[string]any{"watched": steps(30, 40), "can_complete": true, "asked_after": 10,
			"server_steps": completeSteps(12, 13)}, "FAIL", []string{"verdict: FAIL: fewer than 8 of the 10 steps asked for read whole"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := map[string]any{}
			for k, v := range base {
				m[k] = v
			}
			for k, v := range c.change {
				m[k] = v
			}
			data, _ := json.Marshal(m)
			file := filepath.Join(t.TempDir(), "live.json")
			if err := os.WriteFile(file, data, 0o644); err != nil {
				t.Fatal(err)
			}
			out, _, v := check(t, nil, "gpu_live_check.py", "--report", file)
			if v != c.verdict {
				t.Errorf("verdict %s, want %s:\n%s", v, c.verdict, out)
			}
			contains(t, "the report", out, c.want...)
		})
	}
}
