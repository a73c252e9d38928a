package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"vramscope/internal/testkit"
)

// list names every stored trace with its id, a run's ranks together in
// rank and device order, and --name picks by the trace's or the run's name.
func TestList(t *testing.T) {
	db := filepath.Join(t.TempDir(), "v.db")
	if code, _, errs := runCmd("list", "--db", db); code != 2 || !strings.Contains(errs, "no database at "+db) {
		t.Fatalf("list of no database: exit %d, %s", code, errs)
	}
	if code, _, errs := runCmd("import", testkit.Snapshot(t, "oom_nonexpandable.json"), "--db", db); code != 0 {
		t.Fatal(errs)
	}
	if code, _, errs := runCmd("import", "--run", "job", testkit.Snapshot(t, "expandable_oom_multigpu.pickle"),
		testkit.Snapshot(t, "training_22k_user_metadata.pickle"), "--ranks", "1,0", "--db", db); code != 0 {
		t.Fatal(errs)
	}
	code, out, errs := runCmd("list", "--db", db)
	if code != 0 {
		t.Fatal(errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{
		"training_22k_user_metadata.pickle .* 22331 .* job, rank 0",
		`expandable_oom_multigpu.pickle \(cuda:0\) .* 6445 .* job, rank 1`,
		`expandable_oom_multigpu.pickle \(cuda:1\) .* 596 .* 78.29 GiB .* 1 +job, rank 1`,
		`expandable_oom_multigpu.pickle \(cuda:2\) .* 882 .* job, rank 1`,
		"oom_nonexpandable.json .* 1299 .* 21.77 GiB .* 1 +–",
	}
	if len(lines) != len(want)+1 || !strings.HasPrefix(lines[0], "ID ") {
		t.Fatalf("list:\n%s", out)
	}
	for i, w := range want {
		if !regexp.MustCompile(w).MatchString(lines[i+1]) {
			t.Errorf("line %d: %q, want %q", i+1, lines[i+1], w)
		}
	}

	code, out, errs = runCmd("list", "--db", db, "--name", "JOB", "--json")
	if code != 0 {
		t.Fatal(errs)
	}
	var got []listed
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[0].Run == nil || got[0].Run.Name != "job" || got[0].Run.Rank != 0 || got[3].Run.Rank != 1 || got[3].DeviceOrdinal != 2 {
		t.Fatalf("list --name JOB --json: %s", out)
	}
	if len(strings.Fields(got[0].ID)) != 1 || got[0].ID == "" {
		t.Fatalf("no id: %s", out)
	}
	if code, out, _ := runCmd("list", "--db", db, "--name", "nothing", "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("no match: exit %d, %s", code, out)
	}
	if code, _, errs := runCmd("list", "extra", "--db", db); code != 2 || !strings.Contains(errs, `unexpected argument "extra"`) {
		t.Fatalf("an argument: exit %d, %s", code, errs)
	}
}
