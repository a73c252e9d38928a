package store

import (
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

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

// A database another process holds the write lock of is refused after
// the busy timeout, with what the open waited for and how long: on a
// vramscope database it would have marked ended processes' traces, on a
// new file it would have switched it to write-ahead logging.
func TestOpenLocked(t *testing.T) {
	db, path := openTemp(t)
	db.Close()
	fresh := filepath.Join(t.TempDir(), "new.db")
	for _, tc := range []struct{ path, begin, doing string }{
		{path, "BEGIN IMMEDIATE", "to mark the traces of processes that ended"},
		{fresh, "BEGIN EXCLUSIVE", "to switch the file to write-ahead logging"},
	} {
		c, err := sql.Open("sqlite3", tc.path)
		if err != nil {
			t.Fatal(err)
		}
		c.SetMaxOpenConns(1)
		if _, err := c.Exec(tc.begin); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		db, err := Open(tc.path)
		took := time.Since(began).Seconds()
		c.Exec("ROLLBACK")
		c.Close()
		if err == nil {
			db.Close()
			t.Fatalf("%s opened while another connection held the write lock", tc.path)
		}
		m := regexp.MustCompile(`^(.*) is locked: opening it waited ([0-9.]+) s for its write lock, (.*), which another process held \(`).FindStringSubmatch(err.Error())
		if m == nil || m[1] != tc.path || m[3] != tc.doing {
			t.Errorf("%v; want %s locked while %s", err, tc.path, tc.doing)
			continue
		}
		// It says how long it waited: the busy timeout, no more than it took.
		if waited, _ := strconv.ParseFloat(m[2], 64); waited < busyTimeout.Seconds() || waited > took+0.05 {
			t.Errorf("says it waited %s s; the busy timeout is %v and the open took %.2f s", m[2], busyTimeout, took)
		}
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
		// The file is as one open alone makes it.
		c, err := sql.Open("sqlite3", path)
		if err != nil {
			t.Fatal(err)
		}
		var mode string
		var vacuum int
		c.QueryRow("PRAGMA journal_mode").Scan(&mode)
		c.QueryRow("PRAGMA auto_vacuum").Scan(&vacuum)
		c.Close()
		if mode != "wal" || vacuum != autoVacuumIncremental {
			t.Fatalf("round %d: journal mode %q, auto_vacuum %d; want wal, incremental", round, mode, vacuum)
		}
	}
}
