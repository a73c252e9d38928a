package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"vramscope/internal/testkit"
	"vramscope/store"
)

// trace --ranks stores one run of a trace per rank; the first pipeline
// stage peaks.
func TestTraceRanksIsARun(t *testing.T) {
	db := filepath.Join(t.TempDir(), "v.db")
	code, out, errs := runCmd("trace", "--ranks", "4", "--layers", "8",
		"--steps", "2", "--db", db)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errs, out)
	}
	m := regexp.MustCompile(`run (\S+): \S+/runs/(\S+)`).FindStringSubmatch(out)
	if m == nil || m[1] != m[2] {
		t.Fatalf("no run line in\n%s", out)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.Run(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if r.WorldSize != 4 || len(r.Ranks) != 4 || r.Name != "train pp×4" {
		t.Fatalf("run %+v", r)
	}
	var peaks []uint64
	for i, rk := range r.Ranks {
		if rk.Rank != i || len(rk.Traces) != 1 || rk.Traces[0].Events == 0 {
			t.Fatalf("rank %d: %+v", i, rk)
		}
		peaks = append(peaks, rk.Traces[0].PeakAllocated)
	}
	if slices.Index(peaks, slices.Max(peaks)) != 0 {
		t.Errorf("peaks by rank %v", peaks)
	}
	if code, _, errs := runCmd("trace", "--ranks", "2", "--workload", "frag", "--db", db); code != 2 {
		t.Errorf("--ranks with frag: exit %d: %s", code, errs)
	}
	if code, _, errs := runCmd("trace", "--ranks", "2", "--parallel", "tp", "--db", db); code != 2 {
		t.Errorf("--parallel tp: exit %d: %s", code, errs)
	}
}

// import --run: a folder of rank files is one run; --json says each
// rank's devices and traces.
func TestImportRun(t *testing.T) {
	dir := t.TempDir()
	for rank, real := range []string{"snapshot_action_entry.pickle", "expandable_oom_multigpu.pickle"} {
		b, err := os.ReadFile(testkit.Snapshot(t, real))
		if err != nil {
			t.Fatal(err)
		}
		sub := filepath.Join(dir, "job", fmt.Sprintf("rank%d", rank))
		os.MkdirAll(sub, 0o755)
		if err := os.WriteFile(filepath.Join(sub, "snapshot.pickle"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	db := filepath.Join(dir, "v.db")
	code, out, errs := runCmd("import", "--run", "job", filepath.Join(dir, "job"), "--db", db, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "snapshot.pickle (1/2)\n") || !strings.Contains(errs, "snapshot.pickle (2/2)\n") {
		t.Errorf("no progress per file on stderr: %q", errs)
	}
	var res struct {
		Run   string `json:"run"`
		Ranks []struct {
			Rank    int    `json:"rank"`
			File    string `json:"file"`
			Devices []struct {
				Device  int    `json:"device"`
				OOMs    int    `json:"ooms"`
				TraceID string `json:"trace_id"`
			} `json:"devices"`
		} `json:"ranks"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Ranks) != 2 || res.Ranks[1].Rank != 1 || len(res.Ranks[1].Devices) != 3 || res.Ranks[1].Devices[1].OOMs != 1 ||
		!strings.HasSuffix(res.Ranks[0].File, filepath.Join("rank0", "snapshot.pickle")) {
		t.Fatalf("%+v", res)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Run(res.Run)
	s.Close()
	if err != nil || len(r.Ranks) != 2 || r.Ranks[1].Traces[1].ID != res.Ranks[1].Devices[1].TraceID {
		t.Fatalf("run %+v, %v", r, err)
	}
	// The same folder in a tar.gz, as the server takes it.
	tarred := filepath.Join(dir, "job.tar.gz")
	if err := exec.Command("tar", "-C", dir, "-czf", tarred, "job").Run(); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runCmd("import", "--run", "job", tarred, "--db", db, "--json")
	if code != 0 {
		t.Fatalf("a tar: exit %d: %s", code, errs)
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Ranks) != 2 || len(res.Ranks[1].Devices) != 3 ||
		res.Ranks[0].File != "job/rank0/snapshot.pickle" || !strings.Contains(errs, "snapshot.pickle (2)\n") {
		t.Fatalf("a tar: %+v, %v; stderr %q", res, err, errs)
	}
	for _, bad := range [][]string{
		{"import", "--run", "x", tarred, "--ranks", "0"},
		{"import", filepath.Join(dir, "job", "rank0", "snapshot.pickle"), filepath.Join(dir, "job", "rank1", "snapshot.pickle")},
		{"import", "--run", "x", filepath.Join(dir, "job"), "--ranks", "0"},
		{"import", "--run", "x", filepath.Join(dir, "job"), "--ranks", "0,b"},
		{"import", "--run", "x", filepath.Join(dir, "job"), "--device", "1"},
		{"import", "--run", "x", filepath.Join(dir, "nonesuch")},
	} {
		if code, _, errs := runCmd(append(bad, "--db", db)...); code != 2 {
			t.Errorf("%v: exit %d: %s", bad, code, errs)
		}
	}
}

// import --run --join on two machines at once, each with its share of the
// ranks, makes one run of them all; without --join each is a run.
func TestImportRunJoined(t *testing.T) { testkit.EachBackend(t, testImportRunJoined) }

func testImportRunJoined(t *testing.T) {
	dir := t.TempDir()
	db := testkit.DBPath(t)
	var files []string
	for rank, real := range []string{"snapshot_action_entry.pickle", "expandable_oom_multigpu.pickle", "oom_nonexpandable.json"} {
		b, err := os.ReadFile(testkit.Snapshot(t, real))
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, fmt.Sprintf("rank%d_%s", rank, real))
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	first := vramscope(t, "import", "--run", "job", "--join", "--ranks", "0,1", files[0], files[1], "--db", db)
	second := vramscope(t, "import", "--run", "job", "--join", "--ranks", "2", files[2], "--db", db)
	var errA, errB bytes.Buffer
	first.Stderr, second.Stderr = &errA, &errB
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	if err := second.Run(); err != nil {
		t.Fatalf("the second machine: %v: %s", err, errB.String())
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("the first machine: %v: %s", err, errA.String())
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The runs' ranks, from the traces' uploads.
	runs := func() map[string]map[int]bool {
		ts, err := s.Traces()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]map[int]bool{}
		for _, tr := range ts {
			u, err := s.Upload(tr.Upload)
			if err != nil {
				t.Fatal(err)
			}
			if out[u.Run] == nil {
				out[u.Run] = map[int]bool{}
			}
			out[u.Run][u.Rank] = true
		}
		return out
	}
	if rs := runs(); len(rs) != 1 {
		t.Fatalf("runs %v; want one of 3 ranks", rs)
	} else {
		for _, ranks := range rs {
			if len(ranks) != 3 {
				t.Fatalf("runs %v; want one of 3 ranks", rs)
			}
		}
	}
	if code, _, errs := runCmd("import", "--run", "job", files[2], "--ranks", "2", "--db", db); code != 0 {
		t.Fatalf("without --join: exit %d: %s", code, errs)
	}
	if rs := runs(); len(rs) != 2 {
		t.Fatalf("without --join: runs %v; want a second", rs)
	}
}
