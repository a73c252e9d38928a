package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/store"
)

// scenarioDLog writes spec scenario D as an RMM log and returns its path.
func scenarioDLog(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "d.csv")
	if err := os.WriteFile(path, []byte(testkit.RMMLog(testkit.ScenarioD())), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReplayJSONScenarioD(t *testing.T) {
	log := scenarioDLog(t)
	code, out, errs := runCmd("replay", log, "--capacity", "60MiB", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var res struct {
		Stats map[string]int64 `json:"stats"`
		OOMs  []struct {
			Index   int    `json:"index"`
			Size    uint64 `json:"size"`
			Message string `json:"message"`
		} `json:"ooms"`
		Segments []struct {
			Address, TotalSize uint64
			SegmentType        string `json:"segment_type"`
			Blocks             []struct {
				State string `json:"state"`
			} `json:"blocks"`
		} `json:"segments"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.OOMs) != 1 || res.OOMs[0].Index != 15 || res.OOMs[0].Size != 10<<20 ||
		!strings.HasPrefix(res.OOMs[0].Message, "CUDA out of memory. Tried to allocate 10.00 MiB. GPU 0 has a total capacity of 60.00 MiB of which 0 bytes is free.") {
		t.Errorf("ooms %+v", res.OOMs)
	}
	if len(res.Segments) != 3 || res.Segments[0].SegmentType != "large" || len(res.Segments[0].Blocks) != 3 || res.Segments[0].Blocks[1].State != "active_allocated" {
		t.Errorf("segments %+v", res.Segments)
	}
	if res.Stats["num_ooms"] != 1 || len(res.Stats) != 122 {
		t.Errorf("stats: num_ooms %d, %d keys", res.Stats["num_ooms"], len(res.Stats))
	}
	code, out, _ = runCmd("replay", log, "--capacity", "60MiB", "--json", "--alloc-conf", "expandable_segments:True")
	if code != 0 || !strings.Contains(out, `"ooms": []`) {
		t.Errorf("expandable segments should avoid the OOM: exit %d\n%s", code, out[:min(len(out), 300)])
	}
	code, out, _ = runCmd("replay", log, "--capacity", "60MiB")
	if code != 0 || !strings.Contains(out, "PyTorch CUDA memory summary, device ID 0") || !strings.Contains(out, "OOM at request 15") {
		t.Errorf("text output: exit %d\n%s", code, out)
	}
}

func TestReplayErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.csv")
	os.WriteFile(bad, []byte("Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1,allocate,0x10,ten,0\n"), 0o644)
	if code, _, errs := runCmd("replay", bad); code != 2 || !strings.Contains(errs, "line 2, field Size") {
		t.Errorf("exit %d: %s", code, errs)
	}
	if code, _, errs := runCmd("replay", bad, "--alloc-conf", "foo:1"); code != 2 || !strings.Contains(errs, "Unrecognized CachingAllocator option: foo") {
		t.Errorf("exit %d: %s", code, errs)
	}
	if code, _, _ := runCmd("replay"); code != 2 {
		t.Errorf("no file: exit %d", code)
	}
	if code, _, errs := runCmd("frobnicate"); code != 2 || !strings.Contains(errs, "unknown command") {
		t.Errorf("unknown command: exit %d %s", code, errs)
	}
}

func TestTraceRecordsIntoTheStore(t *testing.T) {
	db := filepath.Join(t.TempDir(), "t.db")
	code, out, errs := runCmd("trace", "--workload", "frag", "--capacity", "4GiB", "--db", db, "--quiet")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "OOM: CUDA out of memory. Tried to allocate 2.00 GiB") || !strings.Contains(out, "/traces/") ||
		!strings.Contains(out, "incident 1: http://127.0.0.1:8080/p/") {
		t.Errorf("output:\n%s", out)
	}
	// The simulated device has no driver calls to time.
	if !regexp.MustCompile(`(?m)^ran for \S+$`).MatchString(out) || strings.Contains(out, "driver calls") {
		t.Errorf("no run time, or driver calls on the simulated device:\n%s", out)
	}
	// The workload's note counts as PyTorch's message does.
	note := regexp.MustCompile(`frag: (\S+ \S+) cached free in split segments and (\S+ \S+) on the device`).FindStringSubmatch(out)
	free := regexp.MustCompile(`of which (\S+ \S+) is free`).FindStringSubmatch(out)
	cached := regexp.MustCompile(`and (\S+ \S+) is reserved by PyTorch but unallocated`).FindStringSubmatch(out)
	if note == nil || free == nil || cached == nil || note[1] != cached[1] || note[2] != free[1] {
		t.Errorf("the note and the OOM message disagree:\n%s", out)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	traces, err := s.Traces()
	if err != nil || len(traces) != 1 {
		t.Fatalf("%d traces, %v", len(traces), err)
	}
	tr := traces[0]
	if tr.OOMs != 1 || tr.Status != gpu.StatusComplete || tr.Events < 1000 || tr.Capacity != 4<<30 || !strings.Contains(out, tr.ID) {
		t.Errorf("stored trace %+v", tr)
	}
	line := out[strings.Index(out, "/p/")+3:]
	token := strings.TrimSpace(line[:strings.IndexByte(line, '\n')])
	if p, err := s.Permalink(token); err != nil || !strings.Contains(string(p.State), "/traces/"+tr.ID+"/incidents/1") {
		t.Errorf("permalink %q: %+v %v", token, p, err)
	}
	if code, _, errs := runCmd("trace", "--device", "cuda", "--db", db, "--quiet"); code == 0 || !strings.Contains(errs, "CUDA") {
		t.Errorf("--device cuda without a GPU: exit %d, %s", code, errs)
	}
	if code, _, _ := runCmd("trace", "--workload", "nope", "--db", db); code != 2 {
		t.Errorf("unknown workload: exit %d", code)
	}
}

func TestWhatIfJSON(t *testing.T) {
	db := filepath.Join(t.TempDir(), "w.db")
	if code, _, errs := runCmd("trace", "--workload", "frag", "--capacity", "4GiB", "--db", db, "--quiet"); code != 0 {
		t.Fatal(errs)
	}
	s, _ := store.Open(db)
	traces, _ := s.Traces()
	s.Close()
	code, out, errs := runCmd("whatif", traces[0].ID, "--db", db, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	// The shape: one object per setting, the original first.
	var generic []map[string]any
	if err := json.Unmarshal([]byte(out), &generic); err != nil {
		t.Fatal(err)
	}
	for _, r := range generic {
		keys := slices.Sorted(maps.Keys(r))
		if fmt.Sprint(keys) != "[alloc_conf avoided capacity_needed error fragmentation_at_oom needed_text new_ooms ooms peak_reserved room_at_oom what]" {
			t.Fatalf("keys %v", keys)
		}
	}
	var rows []struct {
		AllocConf string `json:"alloc_conf"`
		OOMs      []struct {
			Index int    `json:"index"`
			Size  uint64 `json:"size"`
		} `json:"ooms"`
		Avoided            []int     `json:"avoided"`
		NewOOMs            []int     `json:"new_ooms"`
		CapacityNeeded     uint64    `json:"capacity_needed"`
		PeakReserved       uint64    `json:"peak_reserved"`
		FragmentationAtOOM []float64 `json:"fragmentation_at_oom"`
		Error              string    `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 2 || rows[0].AllocConf != "" || len(rows[0].OOMs) != 1 || rows[0].OOMs[0].Size != 2<<30 ||
		len(rows[0].FragmentationAtOOM) != 1 || rows[0].FragmentationAtOOM[0] < 0.5 || rows[0].CapacityNeeded <= 4<<30 {
		t.Fatalf("original row %+v", rows)
	}
	oom := rows[0].OOMs[0].Index
	if e := rows[1]; e.AllocConf != "expandable_segments:True" || len(e.OOMs) != 0 || e.PeakReserved == 0 ||
		fmt.Sprint(e.Avoided) != fmt.Sprint([]int{oom}) || len(e.NewOOMs) != 0 || e.CapacityNeeded > 4<<30 || e.Error != "" {
		t.Errorf("expandable row %+v", rows[1])
	}
	code, out, _ = runCmd("whatif", traces[0].ID, "--db", db)
	if code != 0 || !strings.Contains(out, "capacity 4.00 GiB, recorded with the trace") ||
		!strings.Contains(out, fmt.Sprintf("OOM at request %d (fragmentation): Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: it serves this request", oom)) ||
		!strings.Contains(out, "expandable_segments:True would have served this request.") ||
		!strings.Contains(out, "MEMORY NEEDED") || !strings.Contains(out, "with expandable_segments:True (as a per-process limit). Replayed on the recorded device of 4.00 GiB.") {
		t.Errorf("text:\n%s", out)
	}
	code, out, errs = runCmd("whatif", testkit.Snapshot(t, "oom_nonexpandable.json"))
	if code != 0 || !strings.Contains(out, "[original]") || !strings.Contains(out, "expandable_segments:True") ||
		!strings.Contains(out, "capacity 21.94 GiB, inferred from the OOM at event 1117") {
		t.Errorf("snapshot whatif: exit %d %s\n%s", code, errs, out)
	}
	// A stored trace replays on a device of its own capacity: the OOM again.
	code, out, errs = runCmd("replay", traces[0].ID, "--db", db, "--json")
	if code != 0 || !strings.Contains(out, `"index"`) || !strings.Contains(out, "Tried to allocate 2.00 GiB") {
		t.Errorf("replay of a stored trace: exit %d %s\n%.300s", code, errs, out)
	}
	if code, _, _ := runCmd("whatif", "no-such-trace", "--db", db); code != 2 {
		t.Errorf("unknown trace: exit %d", code)
	}
}

// Every command answers -h with its usage line, exit 0, and help lists
// every command.
func TestEveryCommandHasUsage(t *testing.T) {
	code, out, _ := runCmd("help")
	if code != 0 {
		t.Fatalf("help: exit %d", code)
	}
	for name := range commands {
		if !strings.Contains(out, "\n  "+name+" ") {
			t.Errorf("help does not list %s:\n%s", name, out)
		}
		code, _, errs := runCmd(name, "-h")
		if code != 0 || !strings.HasPrefix(errs, "usage: vramscope "+name) {
			t.Errorf("%s -h: exit %d, %.80q", name, code, errs)
		}
		// An unknown flag: the usage, then the error once, exit 2.
		code, _, errs = runCmd(name, "--no-such-flag")
		if code != 2 || !strings.HasPrefix(errs, "usage: vramscope "+name) ||
			!strings.HasSuffix(errs, "vramscope "+name+": flag provided but not defined: -no-such-flag\n") || strings.Count(errs, "not defined") != 1 {
			t.Errorf("%s --no-such-flag: exit %d\n%s", name, code, errs)
		}
	}
	// vramscope -h is the list of commands, not serve's flags.
	for _, h := range []string{"-h", "--help"} {
		if code, hout, _ := runCmd(h); code != 0 || hout != out || !strings.Contains(out, "vramscope COMMAND -h") {
			t.Errorf("vramscope %s: exit %d\n%s", h, code, hout)
		}
	}
	if code, _, errs := runCmd("version", "extra"); code != 2 || !strings.Contains(errs, "version takes no arguments") {
		t.Errorf("version extra: exit %d, %s", code, errs)
	}
}
