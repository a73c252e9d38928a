package store

import (
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"vramscope/internal/hostile"
)

// The mistakes a newcomer makes with --db each get what is wrong and what
// to do, not SQLite's "unable to open database file".
func TestOpenSaysWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	notDB := filepath.Join(dir, "notes.db")
	os.WriteFile(notDB, []byte(strings.Repeat("not a database at all. ", 50)), 0o644)
	other := filepath.Join(dir, "contacts.db")
	c, err := sql.Open("sqlite3", other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec("CREATE TABLE contacts (name TEXT)"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(dir, "missing", "v.db"), "the folder " + filepath.Join(dir, "missing") + " does not exist: create it"},
		{dir, dir + " is a folder, not a database file: name a file in it, such as " + filepath.Join(dir, "vramscope.db")},
		{notDB, notDB + " is not a SQLite database: choose a vramscope database, or a new file name"},
		{other, `a SQLite database of another program (it has a table "contacts"`},
	} {
		db, err := Open(tc.path)
		if err == nil {
			db.Close()
			t.Errorf("%s opened", tc.path)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want %q", tc.path, err, tc.want)
		}
	}
	// Nothing was added to the other program's database.
	c, _ = sql.Open("sqlite3", other)
	defer c.Close()
	var n int
	if err := c.QueryRow("SELECT count(*) FROM sqlite_master").Scan(&n); err != nil || n != 1 {
		t.Errorf("%d tables in the other program's database, %v", n, err)
	}
}

func TestOpenLocked(t *testing.T) {
	db, path := openTemp(t)
	db.Close()
	c, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetMaxOpenConns(1)
	if _, err := c.Exec("BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer c.Exec("ROLLBACK")
	if db, err := Open(path); err == nil {
		db.Close()
		t.Fatal("opened while another connection held the write lock")
	} else if !strings.Contains(err.Error(), path+" is locked: another process has been writing to it") {
		t.Errorf("%v", err)
	}
}

func TestOpenReadOnlyFolder(t *testing.T) {
	dir := hostile.SmallDisk(t, 64<<20)
	db, err := Open(filepath.Join(dir, "v.db"))
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if out, err := exec.Command("mount", "-o", "remount,ro", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot remount read-only: %v: %s", err, out)
	}
	for _, name := range []string{"v.db", "new.db"} {
		db, err := Open(filepath.Join(dir, name))
		if err == nil {
			db.Close()
			t.Fatalf("%s opened on a read-only file system", name)
		}
		if !strings.Contains(err.Error(), "cannot write in its folder "+dir+" (read-only file system)") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Processes that open a new file at once (the ranks of a run imported on
// one machine) apply each migration once: none finds another's tables
// half made, or made, and fails.
func TestOpenNewFileAtOnce(t *testing.T) {
	for round := range 5 {
		path := filepath.Join(t.TempDir(), "new.db")
		errs := make(chan error, 6)
		for range cap(errs) {
			go func() {
				db, err := Open(path)
				if err == nil {
					err = db.Close()
				}
				errs <- err
			}()
		}
		for range cap(errs) {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
}
