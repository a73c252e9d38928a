package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"vramscope/internal/testkit"
)

// Without --db or $VRAMSCOPE_DB every command uses one database per user
// (XDG's data folder), wherever it runs: a file imported in one folder is
// listed from another. $XDG_DATA_HOME moves it, a relative one is ignored,
// and $VRAMSCOPE_DB still wins.
func TestDefaultDatabaseIsPerUser(t *testing.T) {
	snap, err := filepath.Abs(testkit.Snapshot(t, "settings_no_annotations.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_DATA_HOME", "")
	t.Setenv("VRAMSCOPE_DB", "")
	a, b := t.TempDir(), t.TempDir()
	t.Chdir(a)
	if code, _, errs := runCmd("list"); code != 2 || !strings.Contains(errs, "no database at "+filepath.Join(home, ".local", "share", "vramscope", "vramscope.db")+" yet") {
		t.Fatalf("list before any import: exit %d, %s", code, errs)
	}
	if code, _, errs := runCmd("import", snap); code != 0 {
		t.Fatal(errs)
	}
	t.Chdir(b)
	code, out, errs := runCmd("list")
	if code != 0 || !strings.Contains(out, "settings_no_annotations.pickle") {
		t.Fatalf("list in another folder: exit %d, %s%s", code, out, errs)
	}
	for _, dir := range []string{a, b} {
		if _, err := os.Stat(filepath.Join(dir, "vramscope.db")); err == nil {
			t.Errorf("a database was made in the working folder %s", dir)
		}
	}
	if _, err := os.Stat(filepath.Join(home, ".local", "share", "vramscope", "vramscope.db")); err != nil {
		t.Fatal(err)
	}

	xdg := filepath.Join(t.TempDir(), "data")
	t.Setenv("XDG_DATA_HOME", xdg)
	if code, _, errs := runCmd("import", snap); code != 0 {
		t.Fatal(errs)
	}
	if _, err := os.Stat(filepath.Join(xdg, "vramscope", "vramscope.db")); err != nil {
		t.Errorf("with XDG_DATA_HOME: %v", err)
	}
	t.Setenv("XDG_DATA_HOME", "relative/data")
	if got := defaultDB(); got != filepath.Join(home, ".local", "share", "vramscope", "vramscope.db") {
		t.Errorf("a relative XDG_DATA_HOME gives %s", got)
	}
	named := filepath.Join(t.TempDir(), "named.db")
	t.Setenv("VRAMSCOPE_DB", named)
	if code, _, errs := runCmd("import", snap); code != 0 {
		t.Fatal(errs)
	}
	if _, err := os.Stat(named); err != nil {
		t.Errorf("with VRAMSCOPE_DB: %v", err)
	}
}
