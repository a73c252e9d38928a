package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/store"
)

func TestImportJSONFigures(t *testing.T) {
	code, out, errs := runCmd("import", testkit.Snapshot(t, "expandable_oom_multigpu.pickle"), "--dry-run", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var res struct {
		Devices []struct {
			Device, Segments, Blocks, Events, OOMs int
			Allocated                              uint64 `json:"allocated_bytes"`
			Reserved                               uint64 `json:"reserved_bytes"`
		} `json:"devices"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	// PROVENANCE.md: segments d0 2, d1 8, d2 2; events [6445, 596, 882, 0]; the OOM on device 1.
	if len(res.Devices) != 3 || res.Devices[1].Device != 1 || res.Devices[1].Segments != 8 || res.Devices[1].Events != 596 ||
		res.Devices[1].OOMs != 1 || res.Devices[0].Events != 6445 || res.Devices[2].Events != 882 {
		t.Errorf("figures %+v", res.Devices)
	}
	var reserved uint64
	for _, d := range res.Devices {
		reserved += d.Reserved
	}
	if reserved != 114628231168 {
		t.Errorf("reserved %d", reserved)
	}
}

func TestImportStoresTraces(t *testing.T) {
	db := filepath.Join(t.TempDir(), "i.db")
	code, out, errs := runCmd("import", testkit.Snapshot(t, "oom_nonexpandable.json"), "--db", db, "--name", "run 7")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "device 0: 120 segments, 307 blocks, 1299 events") || !strings.Contains(out, "http://127.0.0.1:8080/traces/") {
		t.Errorf("output %q", out)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	traces, _ := s.Traces()
	if len(traces) != 1 || traces[0].Name != "run 7" || traces[0].Events != 1299 || traces[0].OOMs != 1 || traces[0].Source != gpu.SourceSnapshot {
		t.Fatalf("traces %+v", traces)
	}
	l, _, err := s.LayoutAtSeq(traces[0].ID, traces[0].LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if f := l.Figures(); f.Reserved != 22571646976 || f.Allocated != 22536960512 || f.Segments != 120 {
		t.Errorf("final layout %+v", f)
	}
	if ins, _ := s.Incidents(traces[0].ID); len(ins) != 1 || ins[0].Size != 402653184 || ins[0].DeviceFree != 264634368 {
		t.Errorf("incidents %+v", ins)
	}
}

// TestImportLimitsMemory: vramscope import sets the soft memory limit
// for its files, and puts the one before back when done.
func TestImportLimitsMemory(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	path := testkit.Snapshot(t, "oom_nonexpandable.json")
	undo := limitMemory([]string{path})
	if got, want := debug.SetMemoryLimit(-1), ingest.MemoryLimit([]string{path}); got != want || want <= 0 {
		t.Errorf("memory limit %d while importing, want %d", got, want)
	}
	undo()
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("memory limit %d after the import, want the one before", got)
	}
	if code, _, errs := runCmd("import", path, "--dry-run"); code != 0 || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Errorf("exit %d (%s), memory limit %d after", code, errs, debug.SetMemoryLimit(-1))
	}
}

func TestImportRefusesHostileFile(t *testing.T) {
	dir := t.TempDir()
	evil := filepath.Join(dir, "evil.pickle")
	// protocol 2: GLOBAL os system, then REDUCE
	os.WriteFile(evil, []byte("\x80\x02cos\nsystem\nq\x00X\x05\x00\x00\x00touchq\x01\x85q\x02Rq\x03."), 0o644)
	db := filepath.Join(dir, "e.db")
	code, _, errs := runCmd("import", evil, "--db", db)
	if code != 2 || !strings.Contains(errs, "GLOBAL") || !strings.Contains(errs, "offset 2") {
		t.Errorf("exit %d: %s", code, errs)
	}
	if _, err := os.Stat(db); err == nil {
		s, _ := store.Open(db)
		defer s.Close()
		if traces, _ := s.Traces(); len(traces) != 0 {
			t.Errorf("a refused file left %d traces", len(traces))
		}
	}
	trunc := filepath.Join(dir, "t.pickle")
	data, _ := os.ReadFile(testkit.Snapshot(t, "two_gpus_expandable_state_only.pickle"))
	os.WriteFile(trunc, data[:len(data)/2], 0o644)
	if code, _, errs := runCmd("import", trunc, "--dry-run"); code != 2 || !strings.Contains(errs, "byte offset") {
		t.Errorf("truncated: exit %d: %s", code, errs)
	}
}

// Settings that do not parse as PYTORCH_CUDA_ALLOC_CONF are the file's
// fault: refused by --dry-run as by the import, exit 2, the file and the
// field named, nothing stored.
func TestImportRefusesBadSettings(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad_conf.json")
	os.WriteFile(path, []byte(`{"segments": [{"device": 0, "address": 1048576, "total_size": 2097152, "blocks": [{"size": 2097152, "state": "inactive"}]}],
	  "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:Maybe"}}`), 0o644)
	db := filepath.Join(dir, "s.db")
	for _, args := range [][]string{{"--dry-run"}, {"--db", db}} {
		code, _, errs := runCmd(append([]string{"import", path}, args...)...)
		if code != 2 || !strings.Contains(errs, path) || !strings.Contains(errs, `PYTORCH_CUDA_ALLOC_CONF: invalid allocator settings "expandable_segments:Maybe"`) {
			t.Errorf("%v: exit %d: %s", args, code, errs)
		}
	}
	if _, err := os.Stat(db); err == nil {
		s, _ := store.Open(db)
		defer s.Close()
		if traces, _ := s.Traces(); len(traces) != 0 {
			t.Errorf("refused settings left %d traces", len(traces))
		}
	}
}

// A tar (of a run's snapshots) given as one snapshot is named as such,
// not by its first bytes; import --run reads it (TestImportRun).
func TestImportNamesATar(t *testing.T) {
	data, err := os.ReadFile(testkit.Snapshot(t, "two_gpus_expandable_state_only.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	path := tarOf(t, "rank0.pickle", data)
	for _, args := range [][]string{{path, "--dry-run"}, {path, "--db", filepath.Join(t.TempDir(), "t.db")}} {
		code, _, errs := runCmd(append([]string{"import"}, args...)...)
		if code != 2 || !strings.Contains(errs, "job.tar: not a PyTorch snapshot but a tar archive") {
			t.Errorf("%v: exit %d: %s", args, code, errs)
		}
	}
}

// tarOf writes a tar of one file, member, holding data, and returns its path.
func tarOf(t *testing.T, member string, data []byte) string {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: member, Size: int64(len(data)), Mode: 0o644, Typeflag: tar.TypeReg})
	tw.Write(data)
	tw.Close()
	path := filepath.Join(t.TempDir(), "job.tar")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReplaySnapshot(t *testing.T) {
	// The snapshot's request stream on a device as large as the real one
	// (22.57 GB reserved + 264 MB free at the OOM) runs out again.
	code, out, errs := runCmd("replay", testkit.Snapshot(t, "oom_nonexpandable.json"), "--capacity", "22836281344", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var res struct {
		OOMs []struct{ Index int } `json:"ooms"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.OOMs) == 0 {
		t.Errorf("replayed snapshot: %v, %d OOMs", err, len(res.OOMs))
	}
}

// --device N must name a device that holds segments or trace events: the
// empty fourth device of a real snapshot is refused as the empty snapshot
// is, not stored as an empty trace, and the error names the devices to
// pick from; so is a device the snapshot does not list.
func TestImportAndReplayRefuseAnEmptyDevice(t *testing.T) {
	db := filepath.Join(t.TempDir(), "e.db")
	multi := testkit.Snapshot(t, "expandable_oom_multigpu.pickle")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"import", multi, "--device", "3", "--db", db}, "the snapshot's device 3 holds no segments and no trace events (devices that do: 0, 1, 2)"},
		{[]string{"replay", multi, "--device", "3", "--db", db}, "the snapshot's device 3 holds no segments and no trace events (devices that do: 0, 1, 2)"},
		{[]string{"import", multi, "--device", "7", "--db", db}, "the snapshot has no device 7 (devices with segments or trace events: 0, 1, 2)"},
		{[]string{"import", testkit.Snapshot(t, "segments_list_only.pkl"), "--device", "0", "--db", db}, "the snapshot has no device 0 (devices with segments or trace events: 1)"},
	} {
		code, _, errs := runCmd(c.args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", c.args, code, errs, c.want)
		}
	}
	if s, err := store.Open(db); err == nil {
		traces, _ := s.Traces()
		s.Close()
		if len(traces) != 0 {
			t.Errorf("%d traces stored", len(traces))
		}
	}
}

// import - reads the snapshot from standard input, so that export -o -
// pipes into it; the trace is named "stdin" unless --name says otherwise.
func TestImportFromStandardInput(t *testing.T) {
	f, err := os.Open(testkit.Snapshot(t, "windows_paths_small.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stdin := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = stdin }()
	db := filepath.Join(t.TempDir(), "s.db")
	code, out, errs := runCmd("import", "-", "--db", db)
	if code != 0 || !strings.HasPrefix(out, "device 0: 216 segments, 455 blocks, 5163 events, 1377753600 B allocated, 14180941824 B reserved, 0 OOMs, trace ") {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if traces, _ := s.Traces(); len(traces) != 1 || traces[0].Name != "stdin" {
		t.Errorf("stored %+v", traces)
	}
}
