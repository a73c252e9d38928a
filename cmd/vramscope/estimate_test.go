package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/store"
)

// gptScript is the small GPT the estimate's tests train (embedding,
// attention written out, MLP, layer norm, AdamW).
const gptScript = "../../live/testdata/estimate_gpt.py"

// gptConfig is the GPT of the tests below, as estimate_gpt.py's flags.
type gptConfig struct{ batch, seq, layers, d, vocab int }

func (c gptConfig) args() []string {
	return []string{"--batch", strconv.Itoa(c.batch), "--seq", strconv.Itoa(c.seq), "--layers", strconv.Itoa(c.layers),
		"--d", strconv.Itoa(c.d), "--vocab", strconv.Itoa(c.vocab)}
}

// paramBytes is the size of the model's float32 parameters, from its
// shape: the embeddings, per block two layer norms and four linear
// layers, the final norm and the head.
func (c gptConfig) paramBytes() uint64 {
	d := uint64(c.d)
	block := 2*d + 3*d*d + 3*d + d*d + d + 2*d + 4*d*d + 4*d + 4*d*d + d
	return 4 * (uint64(c.vocab)*d + uint64(c.seq)*d + uint64(c.layers)*block + 2*d + uint64(c.vocab)*d)
}

// runEstimateJSON runs vramscope estimate --json with flags on the GPT
// and returns its answer.
func runEstimateJSON(t *testing.T, dbPath string, c gptConfig, flags ...string) estimateJSON {
	t.Helper()
	args := append([]string{"estimate", "--json", "--python", testkit.TorchPython(t), "--db", dbPath}, flags...)
	args = append(append(args, "--", gptScript), c.args()...)
	code, out, errs := runCmd(args...)
	if code != 0 {
		t.Fatalf("vramscope %s: exit %d\n%s", strings.Join(args, " "), code, errs)
	}
	var res estimateJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return res
}

// The estimate is stored as one, fits the default device with the
// figures the allocator gives, and when an optimizer step begins what is
// live is the model's parameters, their gradients and AdamW's two
// moments, the batch and the loss, and the cuBLAS workspaces.
func TestEstimateCommand(t *testing.T) {
	t.Setenv("CUBLAS_WORKSPACE_CONFIG", "")
	dbPath := filepath.Join(t.TempDir(), "e.db")
	c := gptConfig{batch: 4, seq: 64, layers: 2, d: 64, vocab: 512}
	res := runEstimateJSON(t, dbPath, c)
	if !res.Fits || len(res.OOMs) != 0 || res.Capacity != 80<<30-512<<20 || res.CapacityNeeded == 0 || res.CapacityNeeded > 200<<20 {
		t.Fatalf("fits %v, OOMs %v, capacity %d, needs %d", res.Fits, res.OOMs, res.Capacity, res.CapacityNeeded)
	}
	if res.PeakAllocated == 0 || res.PeakAllocated > res.PeakReserved || len(res.Settings) != 6 || res.Estimate.Steps != 3 {
		t.Fatalf("peaks %d and %d, %d settings, %d steps", res.PeakAllocated, res.PeakReserved, len(res.Settings), res.Estimate.Steps)
	}
	db, err := store.Open(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tr, err := db.Trace(res.Trace)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Source != gpu.SourceEstimate || tr.Capacity != res.Capacity || tr.OOMs != 0 || !tr.NoTime {
		t.Fatalf("stored trace %+v", tr)
	}
	rec, err := db.Recording(res.Trace)
	if err != nil {
		t.Fatal(err)
	}
	// The second step's: the first makes AdamW's moments inside it.
	var at int64 = -1
	starts := 0
	for _, a := range rec.Annotations {
		if a.Stage == "START" && strings.HasPrefix(a.Name, "Optimizer.step#") {
			if starts++; starts == 2 {
				at = a.TimeUS
			}
		}
	}
	if at < 0 {
		t.Fatalf("%d optimizer steps began", starts)
	}
	live := map[uint64]uint64{}
	var bytes uint64
	for _, e := range rec.Events[:at] {
		switch e.Action {
		case gpu.ActionAlloc:
			live[e.Addr] = e.Size
			bytes += e.Size
		case gpu.ActionFreeCompleted:
			bytes -= live[e.Addr]
			delete(live, e.Addr)
		}
	}
	p := c.paramBytes()
	batch := 2 * uint64(c.batch*c.seq) * 8 // the int64 inputs and targets
	const loss = 4
	workspaces := uint64(2*32<<20 + 1<<20) // cuBLAS's of the script's thread and autograd's (Hopper), cuBLASLt's
	if want := 4*p + batch + loss + workspaces; bytes != want {
		t.Fatalf("live when the second optimizer step begins: %d bytes in %d allocations; want 4 × %d (parameters, gradients, "+
			"AdamW's moments) + %d (the batch) + %d (the loss) + %d (workspaces) = %d", bytes, len(live), p, batch, loss, workspaces, want)
	}
}

// Checkpointing every block lowers the peak: their activations are made
// again in the backward instead of kept.
func TestEstimateCheckpointLowersThePeak(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "e.db")
	c := gptConfig{batch: 16, seq: 256, layers: 4, d: 128, vocab: 256}
	plain := runEstimateJSON(t, dbPath, c)
	ckpt := runEstimateJSON(t, dbPath, c, "--checkpoint", "Block")
	if ckpt.Estimate.Checkpoint != "Block" || ckpt.Estimate.CheckpointedCalls == 0 {
		t.Fatalf("checkpoint %q, %d calls wrapped", ckpt.Estimate.Checkpoint, ckpt.Estimate.CheckpointedCalls)
	}
	if ckpt.PeakAllocated >= plain.PeakAllocated*3/4 {
		t.Fatalf("peak allocated %s checkpointed, %s without", gpu.FormatBytes(ckpt.PeakAllocated), gpu.FormatBytes(plain.PeakAllocated))
	}
	t.Logf("peak allocated %s checkpointed, %s without; memory needed %s and %s", gpu.FormatBytes(ckpt.PeakAllocated),
		gpu.FormatBytes(plain.PeakAllocated), gpu.FormatBytes(ckpt.CapacityNeeded), gpu.FormatBytes(plain.CapacityNeeded))
}

// Estimates at two batch sizes predict a third with vramscope fit: as
// that batch's own estimate replays.
func TestEstimateFitPredictsAThirdBatch(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "e.db")
	var ids []string
	for _, b := range []int{2, 4, 8} {
		res := runEstimateJSON(t, dbPath, gptConfig{batch: b, seq: 64, layers: 2, d: 64, vocab: 512})
		ids = append(ids, res.Trace)
	}
	code, out, errs := runCmd(append([]string{"fit", "--db", dbPath, "--batch", "2,4,8", "--json", "--"}, ids...)...)
	if code != 0 {
		t.Fatalf("fit: exit %d\n%s", code, errs)
	}
	var res struct {
		Paired, Requests int
		Checks           []struct {
			Predicted, Recorded struct {
				PeakAllocated  uint64 `json:"peak_allocated"`
				PeakReserved   uint64 `json:"peak_reserved"`
				CapacityNeeded uint64 `json:"capacity_needed"`
			}
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Paired != res.Requests || len(res.Checks) != 1 {
		t.Fatalf("%d of %d requests paired, %d checks", res.Paired, res.Requests, len(res.Checks))
	}
	if p, r := res.Checks[0].Predicted, res.Checks[0].Recorded; p != r {
		t.Fatalf("batch 8 predicted from 2 and 4: %+v; its own estimate: %+v", p, r)
	}
}

// On a device too small the estimate says it does not fit, where it runs
// out of memory (an incident of the stored trace), and which settings
// would fit if any.
func TestEstimateTooSmall(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "e.db")
	c := gptConfig{batch: 32, seq: 512, layers: 4, d: 64, vocab: 512} // about 560 MiB at its peak
	args := append([]string{"estimate", "--python", testkit.TorchPython(t), "--db", dbPath, "--device-memory", "1GiB", "--", gptScript}, c.args()...)
	code, out, errs := runCmd(args...)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errs)
	}
	for _, want := range []string{gpu.EstimateNote, "fits            no: out of memory at request", "would fit with", "512.00 MiB for the allocator: 1.00 GiB less 512.00 MiB outside it", "/traces/"} {
		if !strings.Contains(out, want) {
			t.Errorf("the answer lacks %q:\n%s", want, out)
		}
	}
	db, err := store.Open(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ts, _, err := db.TraceList(store.ListQuery{})
	if err != nil || len(ts) != 1 || ts[0].OOMs != 1 || ts[0].Source != gpu.SourceEstimate {
		t.Fatalf("stored %+v, %v", ts, err)
	}
}

// --alloc-conf is the script's PYTORCH_CUDA_ALLOC_CONF: the estimate's
// requests run through the allocator under it (expandable segments map
// pages rather than allocate segments).
func TestEstimateUnderSettings(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "e.db")
	res := runEstimateJSON(t, dbPath, gptConfig{batch: 2, seq: 32, layers: 2, d: 64, vocab: 256}, "--alloc-conf", "expandable_segments:True")
	if res.AllocConf != "expandable_segments:True" {
		t.Fatalf("estimated under %q", res.AllocConf)
	}
	db, err := store.Open(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rec, err := db.Recording(res.Trace)
	if err != nil {
		t.Fatal(err)
	}
	maps := 0
	for _, e := range rec.Events {
		switch e.Action {
		case gpu.ActionSegmentMap:
			maps++
		case gpu.ActionSegmentAlloc:
			t.Fatalf("a segment allocated under expandable segments: %v", e)
		}
	}
	if rec.Settings != "expandable_segments:True" || maps == 0 {
		t.Fatalf("settings %q, %d maps", rec.Settings, maps)
	}
}

// Mistakes exit with status 2 and say what; a script that leaves the GPU
// alone, or fails, exits with 1 and says so.
func TestEstimateCommandErrors(t *testing.T) {
	py := testkit.TorchPython(t)
	dir := t.TempDir()
	cpuOnly := filepath.Join(dir, "cpu_only.py")
	failing := filepath.Join(dir, "failing.py")
	for path, src := range map[string]string{cpuOnly: "import torch\nx = torch.ones(3) * 2\n",
		failing: "import torch\nx = torch.ones(3, device='cuda')\nraise SystemExit(3)\n"} {
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	db := filepath.Join(dir, "e.db")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--device-memory", "16", "--", cpuOnly}, 2, "--device-memory 16 is 16 B: give a unit"},
		{[]string{"--alloc-conf", "expandable_segments:maybe", "--", cpuOnly}, 2, "--alloc-conf"},
		{[]string{"--", filepath.Join(dir, "missing.py")}, 2, "missing.py: no such script"},
		{[]string{}, 2, "give the script to estimate"},
		{[]string{"--", cpuOnly}, 1, "cpu_only.py allocated nothing on the GPU"},
		{[]string{"--", failing}, 1, "exited with status 3 before the estimate was done"},
	} {
		code, _, errs := runCmd(append([]string{"estimate", "--python", py, "--db", db}, c.args...)...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Errorf("estimate %s: exit %d, want %d with %q:\n%s", strings.Join(c.args, " "), code, c.code, c.want, errs)
		}
	}
}
