package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/incident"
	"vramscope/ingest"
	"vramscope/live/python"
	"vramscope/pytorch"
	"vramscope/replay"
	"vramscope/store"
)

func init() {
	register("estimate", "estimate a training script's GPU memory on a CPU, through the allocator: will it fit, and with which settings", runEstimate)
}

// estimateJSON is what estimate --json prints.
type estimateJSON struct {
	Trace          string             `json:"trace"`
	URL            string             `json:"url"`
	Estimate       *pytorch.Estimate  `json:"estimate"`
	AllocConf      string             `json:"alloc_conf"`
	PeakAllocated  uint64             `json:"peak_allocated"`
	PeakReserved   uint64             `json:"peak_reserved"`
	Capacity       uint64             `json:"capacity_bytes"`
	CapacityNeeded uint64             `json:"capacity_needed"`
	Fits           bool               `json:"fits"`
	OOMs           []incident.OOMAt   `json:"ooms"`
	Settings       []estimateSettings `json:"settings"`
}

// estimateSettings is one what-if row: the memory the run needs under it.
type estimateSettings struct {
	AllocConf      string `json:"alloc_conf"`
	CapacityNeeded uint64 `json:"capacity_needed"`
	Fits           bool   `json:"fits"`
}

func runEstimate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("estimate", stderr)
	memory := fs.String("device-memory", "80GiB", "the GPU's memory")
	conf := fs.String("alloc-conf", "", "PYTORCH_CUDA_ALLOC_CONF to estimate under (default: the environment's)")
	py := fs.String("python", "", "the Python whose PyTorch runs the script (default: python3 on PATH)")
	steps := fs.Int("steps", 3, "stop after this many optimizer steps (0: run the script to its end)")
	checkpoint := fs.String("checkpoint", "", "wrap every module of this `CLASS` in torch.utils.checkpoint")
	capability := fs.String("capability", "9.0", "the GPU's compute capability, which sets the cuBLAS workspace (9.0: Hopper)")
	timeLimit := fs.Duration("time-limit", 10*time.Minute, "how long the script may run")
	dbPath := dbFlag(fs, "")
	name := fs.String("name", "", "the trace's name (default: the script and its arguments)")
	out := fs.String("out", "", "keep the estimate's snapshot in this file too")
	addr := uiFlag(fs, "")
	asJSON := fs.Bool("json", false, "print the figures as JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope estimate [--device-memory 80GiB] [--alloc-conf S] [--python P] [--steps 3] [--checkpoint CLASS] [flags] -- SCRIPT ARGS...")
		fmt.Fprintln(stderr, "Runs SCRIPT on this machine's CPU with CUDA stood in for (no GPU needed, no arithmetic done), runs the requests it")
		fmt.Fprintln(stderr, "would make of PyTorch's caching allocator through vramscope's, stores the trace and says whether it fits the device.")
		fs.PrintDefaults()
	}
	// Flags stop at the script: what follows is its own.
	if err := parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	rest := fs.Args()
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) == 0 {
		return usagef("give the script to estimate: vramscope estimate [flags] -- train.py ARGS...")
	}
	deviceMemory, err := gpu.ParseBytes(*memory)
	if err != nil {
		return usagef("--device-memory: %v", err)
	}
	if deviceMemory < 1<<30 {
		return usagef("--device-memory %s is %s: give a unit, as in 24GiB", *memory, gpu.FormatBytes(deviceMemory))
	}
	if _, err := caching.ParseConfig(*conf); err != nil {
		return usagef("--alloc-conf: %v", err)
	}
	if *steps < 0 {
		return usagef("--steps %d: want 0 or more", *steps)
	}
	script := rest[0]
	if st, err := os.Stat(script); err != nil || st.IsDir() {
		return usagef("%s: no such script", script)
	}
	traceName := *name
	if traceName == "" {
		traceName = strings.Join(append([]string{filepath.Base(script)}, rest[1:]...), " ") + " (estimate)"
	}
	if traceName, err = checkName(traceName); err != nil {
		return usagef("the trace's name (--name, else the script's): %v", err)
	}
	interp, err := pythonFor(*py)
	if err != nil {
		return err
	}

	dir, err := os.MkdirTemp("", "vramscope-estimate-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for f, src := range map[string][]byte{python.FileName: python.Source, python.EstimateFileName: python.EstimateSource} {
		if err := os.WriteFile(filepath.Join(dir, f), src, 0o644); err != nil {
			return err
		}
	}
	snapshot := *out
	if snapshot == "" {
		snapshot = filepath.Join(dir, "estimate.pickle")
	}
	helper := []string{"-m", "vramscope_watch", "--estimate", "--quiet", "--steps", strconv.Itoa(*steps), "--device-memory", strconv.FormatUint(deviceMemory, 10),
		"--capability", *capability, "--time-limit", strconv.FormatFloat(timeLimit.Seconds(), 'f', -1, 64), "--out", snapshot}
	if *checkpoint != "" {
		helper = append(helper, "--checkpoint", *checkpoint)
	}
	cmd := exec.Command(interp, append(append(helper, "--"), rest...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir+string(os.PathListSeparator)+os.Getenv("PYTHONPATH"), "PYTHONDONTWRITEBYTECODE=1")
	if flagSet(fs, "alloc-conf") {
		cmd.Env = append(cmd.Env, "PYTORCH_CUDA_ALLOC_CONF="+*conf)
	}
	// What the script prints goes to stderr: stdout is the answer.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, stderr, stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("the estimate of %s did not finish (%s exited with status %d; its reason is above)", script, interp, ee.ExitCode())
		}
		return fmt.Errorf("running %s: %w", interp, err)
	}

	traces, err := pytorch.DecodeFile(snapshot)
	if err == nil && len(traces) == 1 && len(traces[0].Events) == 0 {
		return fmt.Errorf("%s allocated nothing on the GPU: does it move its model and data to cuda?", script)
	}
	if err == nil {
		traces, err = pytorch.Devices(traces, -1)
	}
	if err == nil {
		err = ingest.Check(traces)
	}
	if err != nil {
		return fmt.Errorf("the estimate's snapshot %s: %w", snapshot, err)
	}
	t := traces[0]
	est := t.Estimate()
	if est == nil {
		return fmt.Errorf("the estimate's snapshot %s does not say it is one", snapshot)
	}
	db, err := store.Open(*dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	ids, err := ingest.Store(context.Background(), db, traces, traceName)
	if err != nil {
		return err
	}
	res, err := estimateFigures(t, est)
	if err != nil {
		return err
	}
	res.Trace, res.URL = ids[0], strings.TrimRight(*addr, "/")+"/traces/"+ids[0]
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	printEstimate(stdout, res)
	return nil
}

// pythonFor finds the interpreter: given, else python3 (then python) on
// PATH.
func pythonFor(given string) (string, error) {
	if given != "" {
		p, err := exec.LookPath(given)
		if err != nil {
			return "", usagef("--python %s: %v", given, err)
		}
		return p, nil
	}
	for _, n := range []string{"python3", "python"} {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", usagef("no python3 on PATH: give the Python of your PyTorch environment with --python")
}

// estimateFigures replays the estimate's requests: the peaks on a device
// large enough, and the what-if's memory needed under the recorded
// settings and each other one, against what the allocator may take of
// the device (its memory less the CUDA context).
func estimateFigures(t *pytorch.Trace, est *pytorch.Estimate) (estimateJSON, error) {
	out := estimateJSON{Estimate: est, AllocConf: t.Settings.Conf, Capacity: est.Capacity(), OOMs: []incident.OOMAt{}}
	stream := replay.FromRecording(t.Recording())
	cfg, err := stream.Config("")
	if err != nil {
		return out, err
	}
	large := stream.Unplaced()
	_, whole, err := large.Run(cfg, replay.MaxCapacityNeeded)
	if err != nil {
		return out, err
	}
	out.PeakAllocated, out.PeakReserved = whole.PeakAllocated, whole.PeakReserved
	table, err := incident.Answer(stream)
	if err != nil {
		return out, err
	}
	for i, r := range table.Rows {
		if r.Err != "" {
			continue
		}
		fits := r.CapacityNeeded > 0 && r.CapacityNeeded <= out.Capacity
		if i == 0 {
			out.CapacityNeeded, out.Fits, out.OOMs = r.CapacityNeeded, fits, r.OOMs
			if out.OOMs == nil {
				out.OOMs = []incident.OOMAt{}
			}
			continue
		}
		out.Settings = append(out.Settings, estimateSettings{AllocConf: r.AllocConf, CapacityNeeded: r.CapacityNeeded, Fits: fits})
	}
	return out, nil
}

func printEstimate(w io.Writer, r estimateJSON) {
	e := r.Estimate
	fmt.Fprintln(w, oneLine(e.Summary()))
	if b := e.Beyond(); b != "" {
		fmt.Fprintln(w, oneLine(b))
	}
	conf := r.AllocConf
	if conf == "" {
		conf = "(defaults)"
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "peak allocated  %s\n", gpu.FormatBytes(r.PeakAllocated))
	fmt.Fprintf(w, "peak reserved   %s  under %s\n", gpu.FormatBytes(r.PeakReserved), oneLine(conf))
	fmt.Fprintf(w, "memory needed   %s  the least memory the allocator must have for the whole run (2 MiB steps)\n", neededBytes(r.CapacityNeeded))
	fmt.Fprintf(w, "device          %s for the allocator: %s less %s outside it\n", gpu.FormatBytes(r.Capacity), gpu.FormatBytes(e.DeviceMemory), gpu.FormatBytes(e.OutsideBytes()))
	var fit []string
	best := estimateSettings{}
	for _, s := range r.Settings {
		if s.Fits {
			fit = append(fit, fmt.Sprintf("%s (needs %s)", s.AllocConf, gpu.FormatBytes(s.CapacityNeeded)))
		}
		if s.CapacityNeeded > 0 && (best.CapacityNeeded == 0 || s.CapacityNeeded < best.CapacityNeeded) {
			best = s
		}
	}
	switch {
	case r.Fits:
		fmt.Fprintf(w, "fits            yes, %s to spare", gpu.FormatBytes(r.Capacity-r.CapacityNeeded))
		if best.CapacityNeeded > 0 && best.CapacityNeeded < r.CapacityNeeded {
			fmt.Fprintf(w, "; least with %s: %s", best.AllocConf, gpu.FormatBytes(best.CapacityNeeded))
		}
		fmt.Fprintln(w)
	default:
		fmt.Fprint(w, "fits            no")
		if len(r.OOMs) > 0 {
			fmt.Fprintf(w, ": out of memory at request %d (%s)", r.OOMs[0].Index, gpu.FormatBytes(r.OOMs[0].Size))
		}
		fmt.Fprintln(w)
		if len(fit) > 0 {
			fmt.Fprintf(w, "would fit with  %s\n", strings.Join(fit, ", "))
		} else {
			fmt.Fprintln(w, "would fit with  none of the settings tried: a smaller batch (vramscope fit gives the largest), or --checkpoint CLASS")
		}
	}
	fmt.Fprintf(w, "\ntrace %s: %s\n", r.Trace, r.URL)
}
