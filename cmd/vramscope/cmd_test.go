package main

import (
	"encoding/json"
	"os"
	"path/filepath"
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
	var rows []struct {
		AllocConf          string  `json:"alloc_conf"`
		OOMs               int     `json:"ooms"`
		PeakReserved       uint64  `json:"peak_reserved"`
		FragmentationAtOOM float64 `json:"fragmentation_at_oom"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 2 || rows[0].AllocConf != "" || rows[0].OOMs != 1 || rows[0].FragmentationAtOOM < 0.5 {
		t.Fatalf("original row %+v", rows)
	}
	if rows[1].AllocConf != "expandable_segments:True" || rows[1].OOMs != 0 || rows[1].PeakReserved == 0 {
		t.Errorf("expandable row %+v", rows[1])
	}
	code, out, errs = runCmd("whatif", filepath.Join("..", "..", "..", "shared", "testdata", "pytorch", "oom_nonexpandable.json"))
	if code != 0 || !strings.Contains(out, "[original]") || !strings.Contains(out, "expandable_segments:True") {
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
