package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"vramscope/store"
)

// export --format pprof writes the live set at the peak (or at --at, --seq)
// as a profile pprof reads; wrong combinations of flags are usage errors.
func TestExportPprof(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "p.db")
	if code, _, errs := runCmd("trace", "--workload", "train", "--layers", "2", "--hidden", "512", "--steps", "2", "--db", db, "--quiet"); code != 0 {
		t.Fatal(errs)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	traces, _ := s.Traces()
	s.Close()
	tr := traces[0]
	read := func(file string) *profile.Profile {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		p, err := profile.Parse(f)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	total := func(p *profile.Profile) (n int64) {
		for _, x := range p.Sample {
			n += x.Value[1]
		}
		return n
	}
	peak := filepath.Join(dir, "peak.pb.gz")
	code, _, errs := runCmd("export", tr.ID, "--format", "pprof", "-o", peak, "--db", db)
	if code != 0 || !strings.Contains(errs, "go tool pprof -top") {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if p := read(peak); total(p) != int64(tr.PeakAllocated) || p.SampleType[1].Type != "inuse_space" {
		t.Errorf("the peak's profile holds %d bytes, the peak is %d", total(p), tr.PeakAllocated)
	}
	first := filepath.Join(dir, "first.pb.gz")
	if code, _, errs := runCmd("export", tr.ID, "--format", "pprof", "--seq", "1", "-o", first, "--db", db); code != 0 {
		t.Fatal(errs)
	}
	if p := read(first); len(p.Sample) != 1 {
		t.Errorf("after the first allocation: %d samples", len(p.Sample))
	}
	atEnd := filepath.Join(dir, "end.pb.gz")
	if code, _, errs := runCmd("export", tr.ID, "--format", "pprof", "--at", "99999999999", "-o", atEnd, "--db", db); code != 0 {
		t.Fatal(errs)
	}
	for _, bad := range [][]string{
		{"--format", "svg"}, {"--format", "pprof", "--device", "0"}, {"--at", "5"},
		{"--format", "pprof", "--at", "5", "--seq", "3"}, {"--format", "pprof", "--seq", "99999999"},
	} {
		args := append([]string{"export", tr.ID, "-o", filepath.Join(dir, "x"), "--db", db}, bad...)
		if code, _, errs := runCmd(args...); code != 2 || errs == "" {
			t.Errorf("%q: exit %d, %q; want a usage error", bad, code, errs)
		}
	}
}
