package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A newcomer's mistakes with files each get exit status 2 and a message
// that says what is wrong and what to do.
func TestFileMistakes(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "v.db")
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	png := write("plot.png", "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
	notSnapshot := write("config.json", `{"lr": 0.001}`)
	empty := write("empty.pickle", "")
	missing := filepath.Join(dir, "no", "such", "folder")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"import", png, "--db", db}, "plot.png: not a PyTorch snapshot: it starts with bytes 89 50"},
		{[]string{"import", notSnapshot, "--db", db}, `config.json: snapshot: top level: missing key "segments"`},
		{[]string{"import", empty, "--db", db}, "empty.pickle: the file is empty"},
		{[]string{"import", dir, "--db", db}, dir + " is a folder: import --run NAME " + dir + " imports its files as the ranks of one run"},
		{[]string{"export", "someid", "-o", filepath.Join(missing, "t.pickle"), "--db", db}, "the folder " + missing + " does not exist: create it"},
		{[]string{"export", "someid", "--format", "pprof", "-o", filepath.Join(missing, "l.pb.gz"), "--db", db}, "the folder " + missing + " does not exist"},
		{[]string{"export", "someid", "-o", dir, "--db", db}, "-o " + dir + " is a folder: name a file in it"},
		{[]string{"export", "someid", "-o", filepath.Join(dir, "t.pickle"), "--db", db}, "no database at " + db},
		{[]string{"compare", "a", "b", "--db", db}, "no database at " + db},
	} {
		code, _, errs := runCmd(tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %s; want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("a refused command made the database: %v", err)
	}
}

// Malformed workload settings and sizes are refused before a trace is made.
func TestTraceSettingMistakes(t *testing.T) {
	db := filepath.Join(t.TempDir(), "v.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--workload", "serve-kv", "--kv", "pagged"}, `--kv must be contiguous or paged, not "pagged"`},
		{[]string{"--workload", "frag", "--fill", "2"}, "frag: fill must be in (0,1), got 2"},
		{[]string{"--workload", "train", "--steps", "0"}, "train: layers, hidden, vocab, batch, seq, steps and dtype bytes must be positive"},
		{[]string{"--workload", "train", "--ranks", "2", "--parallel", "dp", "--seq", "0"}, "train: layers, hidden"},
		{[]string{"--workload", "frag", "--capacity", "16"}, "--capacity 16 is 16 bytes, less than one 2.00 MiB segment: give a unit, as in 16GiB"},
		{[]string{"--workload", "frag", "--capacity", "16GiBs"}, `--capacity: size "16GiBs": unknown unit`},
		{[]string{"--workload", "frag", "--alloc-conf", "expandable_segments=True"}, "--alloc-conf: Unrecognized CachingAllocator option: expandable_segments=True"},
		{[]string{"--workload", "train", "--step-time", "-2s"}, "--step-time -2s: a step cannot take less than no time"},
		{[]string{"--workload", "frag", "--device", "cuda:1"}, `--device must be sim or cuda (or, with --workload replay, a snapshot's device number), not "cuda:1"`},
	} {
		code, _, errs := runCmd(append([]string{"trace", "--db", db, "--quiet"}, tc.args...)...)
		if code != 2 || !strings.Contains(errs, tc.want) {
			t.Errorf("trace %v: exit %d, %s; want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
	if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused traces made the database: %v", err)
	}
	log := scenarioDLog(t)
	for _, cmd := range []string{"replay", "whatif"} {
		if code, _, errs := runCmd(cmd, log, "--capacity", "60"); code != 2 || !strings.Contains(errs, "--capacity 60 is 60 bytes") {
			t.Errorf("%s --capacity 60: exit %d, %s", cmd, code, errs)
		}
	}
}
