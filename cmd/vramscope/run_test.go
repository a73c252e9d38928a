package main

import (
	"path/filepath"
	"regexp"
	"slices"
	"testing"

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
