package main

import (
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/mattn/go-sqlite3"

	"vramscope/store"
)

// A stored trace whose id starts with '-' (as ids made before they were
// kept from it could) works with every command that takes a trace: after
// --, or as --trace; given bare, the error says how.
func TestTraceIDStartingWithADash(t *testing.T) {
	db := filepath.Join(t.TempDir(), "dash.db")
	if code, _, errs := runCmd("trace", "--workload", "frag", "--capacity", "4GiB", "--db", db, "--quiet"); code != 0 {
		t.Fatal(errs)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	traces, _ := s.Traces()
	s.Close()
	const id = "-59cSbf9MxRGq3SK"
	raw, err := sql.Open("sqlite3", db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec("UPDATE traces SET id = ? WHERE id = ?", id, traces[0].ID); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	out := filepath.Join(t.TempDir(), "x.pickle")
	for _, args := range [][]string{
		{"export", "--db", db, "-o", out, "--", id},
		{"export", "--db", db, "-o", out, "--trace", id},
		{"whatif", "--db", db, "--", id},
		{"whatif", "--db", db, "--trace", id},
		{"replay", "--db", db, "--trace", id},
		{"replay", "--db", db, "--", id},
		{"trace", "--workload", "replay", "--db", db, "--quiet", "--trace", id},
	} {
		if code, _, errs := runCmd(args...); code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, errs)
		}
	}
	for _, cmd := range []string{"export", "whatif", "replay"} {
		code, _, errs := runCmd(cmd, id, "--db", db, "-o", out)
		if code != 2 || !strings.Contains(errs, id+" looks like a trace id: put it after --") || !strings.Contains(errs, "--trace "+id) {
			t.Errorf("%s %s: exit %d: %s", cmd, id, code, errs)
		}
	}
}
