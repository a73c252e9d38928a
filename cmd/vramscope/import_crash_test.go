package main

import (
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"vramscope/store"
)

// vramscope runs this test binary as the vramscope command.
func vramscope(t testing.TB, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "VRAMSCOPE_RUN_MAIN=1")
	return cmd
}

// count reads a number from the database file as any other process may,
// below the store (which hides unfinished imports).
func count(t *testing.T, db, query string) int {
	t.Helper()
	c, err := sql.Open("sqlite3", "file:"+db+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var n int
	if err := c.QueryRow(query).Scan(&n); err != nil {
		return -1
	}
	return n
}

// TestImportKilledMidWay kills `vramscope import` of a 1.2M-event snapshot
// with SIGKILL once it has committed rows: while it runs, no reader sees
// its trace; after the kill, the next open removes every row of it.
func TestImportKilledMidWay(t *testing.T) {
	dir := t.TempDir()
	src, dst, snap := filepath.Join(dir, "src.db"), filepath.Join(dir, "dst.db"), filepath.Join(dir, "big.pickle")
	if out, err := vramscope(t, "trace", "--workload", "train", "--steps", "3000", "--layers", "4", "--hidden", "512", "--db", src, "--quiet").CombinedOutput(); err != nil {
		t.Fatalf("trace: %v\n%s", err, out)
	}
	s, err := store.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := s.Traces()
	s.Close()
	if len(ts) != 1 {
		t.Fatalf("%d traces recorded", len(ts))
	}
	if out, err := vramscope(t, "export", ts[0].ID, "--db", src, "-o", snap).CombinedOutput(); err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}

	cmd := vramscope(t, "import", snap, "--db", dst)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(120 * time.Second)
	for count(t, dst, "SELECT count(*) FROM chunks") < 20 {
		if time.Now().After(deadline) {
			t.Fatal("the import committed no rows in 120 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Mid-import: rows are there, and no reader sees them.
	s, err = store.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	ts, err = s.Traces()
	s.Close()
	if err != nil || len(ts) != 0 {
		t.Fatalf("during the import the list shows %d traces (%v)", len(ts), err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the import was not killed: %v", err)
	}
	if n := count(t, dst, "SELECT count(*) FROM chunks"); n == 0 {
		t.Fatal("the import finished before the kill; the test shows nothing")
	}

	s, err = store.Open(dst)
	if err != nil {
		t.Fatalf("the database does not open after the kill: %v", err)
	}
	ts, err = s.Traces()
	s.Close()
	if err != nil || len(ts) != 0 {
		t.Fatalf("after the kill the list shows %d traces (%v)", len(ts), err)
	}
	for _, table := range []string{"traces", "chunks", "checkpoints", "usage_levels", "stacks", "alloc_bins"} {
		if n := count(t, dst, "SELECT count(*) FROM "+table); n != 0 {
			t.Errorf("%d rows left in %s", n, table)
		}
	}
}
