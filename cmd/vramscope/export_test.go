package main

import (
	"path/filepath"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/store"
)

// TestExportImportRoundTrip: import(export(t)) gives back the same trace:
// the same events, the same stacks, the same layouts.
func TestExportImportRoundTrip(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "e.db")
	if code, _, errs := runCmd("trace", "--workload", "frag", "--capacity", "4GiB", "--alloc-conf", "expandable_segments:True", "--db", db, "--quiet"); code != 0 {
		t.Fatal(errs)
	}
	if code, _, errs := runCmd("trace", "--workload", "train", "--layers", "2", "--hidden", "512", "--steps", "2", "--db", db, "--quiet"); code != 0 {
		t.Fatal(errs)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	traces, _ := s.Traces()
	s.Close()
	for _, orig := range traces {
		file := filepath.Join(dir, orig.ID+".pickle")
		if code, _, errs := runCmd("export", orig.ID, "-o", file, "--db", db); code != 0 {
			t.Fatalf("export: %s", errs)
		}
		db2 := filepath.Join(dir, orig.ID+".db")
		code, out, errs := runCmd("import", file, "--db", db2)
		if code != 0 {
			t.Fatalf("import: %s", errs)
		}
		if strings.Contains(errs, "mismatch") {
			t.Errorf("import reported mismatches: %s", errs)
		}
		a, _ := store.Open(db)
		b, _ := store.Open(db2)
		back, _ := b.Traces()
		if len(back) != 1 {
			t.Fatalf("%d traces after import: %s", len(back), out)
		}
		ea, err1 := a.Events(orig.ID, 0, orig.LastSeq+1)
		eb, err2 := b.Events(back[0].ID, 0, back[0].LastSeq+1)
		if err1 != nil || err2 != nil || len(ea) != len(eb) || len(ea) == 0 {
			t.Fatalf("%s: %d events, then %d (%v %v)", orig.Name, len(ea), len(eb), err1, err2)
		}
		for i := range ea {
			x, y := ea[i], eb[i]
			sx, _ := a.Stack(orig.ID, x.Stack)
			sy, _ := b.Stack(back[0].ID, y.Stack)
			x.Stack, y.Stack = 0, 0
			if x.Pool != y.Pool && (x.Action == gpu.ActionSegmentAlloc || x.Action == gpu.ActionSegmentMap) {
				y.Pool = x.Pool // snapshots name no pool per event; it is read from the segment
			}
			x.Pool, y.Pool = 0, 0
			if x != y || !equalStacks(sx, sy) {
				t.Fatalf("%s: event %d: %v then %v", orig.Name, i, ea[i], eb[i])
			}
		}
		la, _, _ := a.LayoutAtSeq(orig.ID, orig.LastSeq)
		lb, _, _ := b.LayoutAtSeq(back[0].ID, back[0].LastSeq)
		if la.Figures() != lb.Figures() {
			t.Errorf("%s: final layout %+v then %+v", orig.Name, la.Figures(), lb.Figures())
		}
		if back[0].Settings != orig.Settings || back[0].PeakReserved != orig.PeakReserved || back[0].OOMs != orig.OOMs {
			t.Errorf("%s: trace %+v then %+v", orig.Name, orig, back[0])
		}
		a.Close()
		b.Close()
	}
}

func equalStacks(a, b gpu.Stack) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
