package live_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/server"
	"vramscope/store"
)

// The estimate's scripts: a small GPT trained with AdamW, and the harness
// that runs a script under the estimate's hooks.
const (
	gptScript     = "testdata/estimate_gpt.py"
	harnessScript = "testdata/estimate_harness.py"
)

// estimateCmd is python -m vramscope_watch --estimate ARGS, on the Python
// that imports torch, with the helper from python/.
func estimateCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	py := testkit.TorchPython(t)
	cmd := exec.Command(py, append([]string{"-m", "vramscope_watch", "--estimate"}, args...)...)
	helper, _ := filepath.Abs("python")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+helper, "PYTHONDONTWRITEBYTECODE=1")
	return cmd
}

// harness runs estimate_harness.py in mode on the GPT script with args and
// returns its requests, as [action, size] pairs.
func harness(t *testing.T, mode string, args ...string) [][2]any {
	t.Helper()
	py := testkit.TorchPython(t)
	helper, _ := filepath.Abs("python")
	cmd := exec.Command(py, append([]string{harnessScript, helper, mode, gptScript}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", harnessScript, mode, err, stderr.String())
	}
	var pairs [][2]any
	if err := json.Unmarshal(out, &pairs); err != nil {
		t.Fatalf("%s %s: %v", harnessScript, mode, err)
	}
	return pairs
}

// The estimate (meta standing in for cuda, no arithmetic) makes the
// requests the same script makes when it runs for real on the CPU,
// recorded by the same hooks with storages told apart by their data
// pointers: the same sizes in the same order, frees included.
func TestEstimateMakesTheRealRunsRequests(t *testing.T) {
	args := []string{"--batch", "3", "--seq", "48", "--layers", "2", "--d", "64", "--vocab", "320"}
	est := harness(t, "estimate", args...)
	cpu := harness(t, "cpu", append(args, "--device", "cpu")...)
	allocs, frees := 0, 0
	for _, p := range est {
		switch p[0] {
		case "alloc":
			allocs++
		case "free_requested":
			frees++
		}
	}
	// 3 steps of a 2-layer GPT: its parameters, activations, gradients,
	// optimizer state and temporaries
	if allocs < 500 || frees < 400 {
		t.Fatalf("the estimate made %d allocations and %d frees: too few to be the training", allocs, frees)
	}
	for i := range min(len(est), len(cpu)) {
		if !reflect.DeepEqual(est[i], cpu[i]) {
			lo := max(0, i-3)
			t.Fatalf("request %d: estimated %v, the CPU run made %v\nestimate: %v\ncpu:      %v", i, est[i], cpu[i], est[lo:min(i+4, len(est))], cpu[lo:min(i+4, len(cpu))])
		}
	}
	if len(est) != len(cpu) {
		t.Fatalf("the estimate made %d requests, the CPU run %d", len(est), len(cpu))
	}
}

// Two estimates of one script are the same snapshot: the same requests,
// frames, regions and figures (but the seconds each took).
func TestEstimateIsDeterministic(t *testing.T) {
	dir := t.TempDir()
	var snaps []any
	for _, name := range []string{"a.pickle", "b.pickle"} {
		out := filepath.Join(dir, name)
		cmd := estimateCmd(t, "--quiet", "--out", out, gptScript, "--batch", "2", "--seq", "32")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		top := unpickled(t, out)
		for i, kv := range top {
			if kv.Key == pytorch.EstimateKey {
				mark := kv.Value.(pytorch.Dict)
				top[i].Value = slicesDeleteKey(mark, "seconds")
			}
		}
		snaps = append(snaps, top)
	}
	if !reflect.DeepEqual(snaps[0], snaps[1]) {
		t.Fatal("two estimates of the same script differ")
	}
	traces := snaps[0].(pytorch.Dict)
	entries, _ := traces.Get("device_traces")
	if n := len(entries.([]any)[0].([]any)); n < 300 {
		t.Fatalf("%d entries", n)
	}
}

func slicesDeleteKey(d pytorch.Dict, key string) pytorch.Dict {
	out := pytorch.Dict{}
	for _, kv := range d {
		if kv.Key != key {
			out = append(out, kv)
		}
	}
	return out
}

// An op the stand-in device cannot run stops the estimate with its name
// and the script's line; so does a script that never reaches an
// optimizer step before the time limit; and one that fails says how.
func TestEstimateErrorsSayWhatAndWhere(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	nonzero := write("nonzero.py", "import torch\nx = torch.ones(8, device='cuda')\nkeep = torch.nonzero(x > 0)\n")
	forever := write("forever.py", "import torch\nx = torch.ones(8, device='cuda')\nwhile True:\n    x = x + 1\n")
	broken := write("broken.py", "import torch\nx = torch.ones(8, device='cuda')\nraise ValueError('no data at /data/train')\n")
	for _, c := range []struct {
		script string
		args   []string
		want   []string
	}{
		{nonzero, nil, []string{"nonzero.py:3", "aten.nonzero", "depends on tensor values"}},
		{forever, []string{"--time-limit", "2"}, []string{"forever.py ran 2 s", "without reaching an optimizer step"}},
		{broken, nil, []string{"broken.py raised ValueError", "no data at /data/train", "broken.py\", line 3"}},
	} {
		cmd := estimateCmd(t, append(c.args, "--out", filepath.Join(dir, "x.pickle"), c.script)...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("%s: %v, want exit status 1\n%s", c.script, err, out)
		}
		for _, w := range c.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: the message lacks %q:\n%s", filepath.Base(c.script), w, out)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "x.pickle")); err == nil {
			t.Errorf("%s: a snapshot was written", filepath.Base(c.script))
		}
	}
}

// The server serves the estimate's module beside the watcher.
func TestEstimateModuleServed(t *testing.T) {
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	t.Cleanup(srv.Close)
	servedAsIs(t, srv.URL, "vramscope_estimate.py")
}

// Under torch.autocast("cuda", bfloat16) the estimate makes the requests
// a real H200 made for the same model (record.py's GPT: 768 wide, batch 8
// × 1024, vocab 32000; train_default.pickle): from its first step's start
// to its first linear layer, the embeddings in float32, the layer norm's
// three outputs in float32, then the linear's casts (bias, weight, input,
// in that order), its output, and the cuBLAS and cuBLASLt workspaces.
func TestEstimateAutocastAsRecorded(t *testing.T) {
	real := firstStepRequests(t, testkit.SnapshotOf(t, "pytorch-2.11", "train_default.pickle"), false, 17)
	out := filepath.Join(t.TempDir(), "amp.pickle")
	cmd := estimateCmd(t, "--quiet", "--steps", "1", "--out", out, gptScript,
		"--amp", "--batch", "8", "--seq", "1024", "--d", "768", "--layers", "1", "--vocab", "32000")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	est := firstStepRequests(t, out, true, 17)
	if !reflect.DeepEqual(est, real) {
		t.Fatalf("the first step's first requests:\nestimated %v\nrecorded  %v", est, real)
	}
}

// firstStepRequests reads the first n requests (alloc and free, with
// their sizes) from the start of a snapshot's ProfilerStep#0. An
// estimate's times count the requests made: a region at n starts before
// request n+1.
func firstStepRequests(t *testing.T, path string, estimated bool, n int) []string {
	t.Helper()
	top := unpickled(t, path)
	anns, _ := top.Get("external_annotations")
	start := int64(-1)
	for _, a := range anns.([]any) {
		a := a.(pytorch.Dict)
		if name, _ := a.Get("name"); name == "ProfilerStep#0" {
			at, _ := a.Get("time_us")
			start = at.(int64)
			break
		}
	}
	dt, _ := top.Get("device_traces")
	var out []string
	for _, e := range dt.([]any)[0].([]any) {
		e := e.(pytorch.Dict)
		at, _ := e.Get("time_us")
		action, _ := e.Get("action")
		size, _ := e.Get("size")
		if at.(int64) < start || estimated && at.(int64) == start {
			continue
		}
		if action == "alloc" || action == "free_requested" {
			out = append(out, fmt.Sprintf("%s %d", action, size))
		}
		if len(out) == n {
			break
		}
	}
	return out
}

// --url uploads the estimate to a server, where it is stored as an
// estimate of the device it was made for, and the link is printed.
func TestEstimateUploads(t *testing.T) {
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	t.Cleanup(srv.Close)
	cmd := estimateCmd(t, "--url", srv.URL, "--device-memory", "24GiB", gptScript, "--batch", "2", "--seq", "32")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ts, _, err := db.TraceList(store.ListQuery{})
	if err != nil || len(ts) != 1 {
		t.Fatalf("%d traces stored, %v", len(ts), err)
	}
	tr := ts[0]
	if tr.Source != gpu.SourceEstimate || tr.Capacity != 24<<30-512<<20 || tr.Name != "estimate_gpt.py --batch 2 --seq 32 (estimate)" {
		t.Fatalf("stored %+v", tr)
	}
	if !strings.Contains(string(out), "vramscope: estimate: "+srv.URL+"/traces/"+tr.ID) {
		t.Fatalf("no link to the trace:\n%s", out)
	}
}

// A mixed-precision loop with GradScaler, gradient clipping and a
// pinned-memory DataLoader runs under the estimate: GradScaler's unscale
// and update only write into tensors they are given, so they need no
// kernel on the stand-in device.
func TestEstimateGradScaler(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "amp.py")
	src := `import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scaler = torch.cuda.amp.GradScaler()
ds = torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randint(0, 10, (64,)))
for x, y in torch.utils.data.DataLoader(ds, batch_size=16, pin_memory=True):
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    with torch.cuda.amp.autocast():
        loss = nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
`
	if err := os.WriteFile(script, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "amp.pickle")
	if b, err := estimateCmd(t, "--quiet", "--out", out, script).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	mark, _ := unpickled(t, out).Get(pytorch.EstimateKey)
	if steps, _ := mark.(pytorch.Dict).Get("steps"); steps != int64(3) {
		t.Fatalf("%v optimizer steps, want 3", steps)
	}
}

// unpickled is the file at path decoded as a snapshot's top dictionary.
func unpickled(t *testing.T, path string) pytorch.Dict {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := pytorch.Unpickle(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v.(pytorch.Dict)
}
