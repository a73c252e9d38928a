package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"vramscope/internal/pgtest"

	"vramscope/gpu"
	"vramscope/store"
)

// TestMain lets a test run this binary as the vramscope command itself.
func TestMain(m *testing.M) {
	if os.Getenv("VRAMSCOPE_RUN_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	code := m.Run()
	pgtest.Stop()
	os.Exit(code)
}

// TestTraceKilledMidRun kills a running `vramscope trace` with SIGKILL: the
// database still opens, the trace is marked incomplete, and every event
// committed before the kill reads back.
func TestTraceKilledMidRun(t *testing.T) {
	db := filepath.Join(t.TempDir(), "k.db")
	cmd := exec.Command(os.Args[0], "trace", "--workload", "train", "--steps", "100000", "--layers", "4", "--hidden", "512", "--db", db, "--quiet")
	cmd.Env = append(os.Environ(), "VRAMSCOPE_RUN_MAIN=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	// Wait until some events are committed, reading as another process would.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatal("no events committed in 60 s")
		}
		time.Sleep(200 * time.Millisecond)
		if _, err := os.Stat(db); err != nil {
			continue
		}
		s, err := store.Open(db)
		if err != nil {
			continue
		}
		traces, _ := s.Traces()
		s.Close()
		if len(traces) == 1 && traces[0].Events > 50000 {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the trace process was not killed: %v", err)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatalf("the database does not open after the kill: %v", err)
	}
	defer s.Close()
	traces, err := s.Traces()
	if err != nil || len(traces) != 1 {
		t.Fatalf("%d traces, %v", len(traces), err)
	}
	tr := traces[0]
	if tr.Status != gpu.StatusIncomplete {
		t.Errorf("status %s, want incomplete", tr.Status)
	}
	events, err := s.Events(tr.ID, 0, tr.LastSeq+1)
	if err != nil || int64(len(events)) != tr.Events || tr.Events == 0 {
		t.Fatalf("%d events readable of %d committed: %v", len(events), tr.Events, err)
	}
	for i, e := range events {
		if e.Seq != int64(i) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}
	if _, _, err := s.LayoutAtSeq(tr.ID, tr.LastSeq); err != nil {
		t.Errorf("layout at the last committed event: %v", err)
	}
}
