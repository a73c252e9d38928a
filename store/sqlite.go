package store

import (
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/mattn/go-sqlite3" // registers the "sqlite3" driver

	"vramscope/migrations"
)

// sqliteBackend is one SQLite file, written by one process at a time.
type sqliteBackend struct{ path string }

func dsn(path string, params string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + params
}

// openSQLite opens (creating if needed) the SQLite database at path.
// Opening needs no free space: on a full disk it gives up the reserve, and
// tidying is left for a later open if even that is not enough.
func openSQLite(path string) (*DB, error) {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	began := time.Now()
	// The journal mode and auto_vacuum are set by useWAL, not by the DSN
	// on every connection: see there.
	w, err := sql.Open("sqlite3", dsn(path, "_synchronous=NORMAL&_busy_timeout=5000&_txlock=immediate"))
	if err != nil {
		return nil, err
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	// Readers keep their prepared statements and 16 MiB of pages between
	// answers: a run's heatmap asks the same few queries of a hundred
	// traces.
	r, err := sql.Open("sqlite3", dsn(path, "mode=ro&_busy_timeout=5000&_stmt_cache_size=64&_cache_size=-16384"))
	if err != nil {
		w.Close()
		return nil, err
	}
	r.SetMaxOpenConns(max(4, runtime.NumCPU()))
	r.SetMaxIdleConns(max(4, runtime.NumCPU()))
	be := &sqliteBackend{path: path}
	db := &DB{path: path, be: be, owner: int64(os.Getpid()), w: w, r: r, jobs: make(chan job, 4), done: make(chan struct{})}
	if err := useWAL(w, began.Add(busyTimeout)); err != nil {
		w.Close()
		r.Close()
		return nil, openError(path, err, time.Since(began), "to switch the file to write-ahead logging")
	}
	if err := db.roomy(func() error { return migrateSQLite(w) }); err != nil {
		w.Close()
		r.Close()
		return nil, openError(path, err, time.Since(began), "to bring its schema up to date")
	}
	be.enableAutoVacuum(w)
	if err := db.start(); err != nil {
		return nil, openError(path, err, time.Since(began), "to mark the traces of processes that ended")
	}
	return db, nil
}

// busyTimeout is how long a write waits for another process's write lock
// (the DSN's _busy_timeout).
const busyTimeout = 5 * time.Second

// useWAL puts the database in write-ahead logging (readers and the one
// writer do not block each other), waiting until deadline for the lock
// that takes. SQLite changes the mode by upgrading a read transaction to
// a write one, and an upgrade does not call the busy handler (it could
// deadlock): a process that opens a new file while another converts it
// gets SQLITE_BUSY at once, whatever the busy timeout. So this waits as
// the busy handler would. It also asks a new file for incremental
// auto_vacuum, which takes effect only before the first table (older
// files are converted by enableAutoVacuum when there is room); neither
// is asked again of a file that has it, as that too takes the write lock.
func useWAL(w *sql.DB, deadline time.Time) error {
	var pages int64
	if err := w.QueryRow("PRAGMA page_count").Scan(&pages); err != nil {
		return err
	}
	if pages == 0 {
		if _, err := w.Exec("PRAGMA auto_vacuum = INCREMENTAL"); err != nil {
			return err
		}
	}
	var mode string
	if err := w.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode == "wal" {
		return err
	}
	pause := time.Millisecond
	for {
		err := w.QueryRow("PRAGMA journal_mode = WAL").Scan(&mode)
		var se sqlite3.Error
		if err == nil || !errors.As(err, &se) || se.Code != sqlite3.ErrBusy || time.Now().After(deadline) {
			return err
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// openError says what is wrong with the database at path, and what to do,
// where SQLite's words ("unable to open database file: no such file or
// directory" for a read-only folder) do not. waited is how long the open
// had been trying, doing what.
func openError(path string, err error, waited time.Duration, doing string) error {
	dir := filepath.Dir(path)
	var se sqlite3.Error
	errors.As(err, &se)
	if st, serr := os.Stat(path); serr == nil && st.IsDir() {
		return fmt.Errorf("%s is a folder, not a database file: name a file in it, such as %s", path, filepath.Join(path, "vramscope.db"))
	}
	if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
		return fmt.Errorf("%s: the folder %s does not exist: create it, or choose a database file in a folder that does", path, dir)
	}
	if aerr := syscall.Access(dir, 2 /* W_OK */); aerr != nil {
		return fmt.Errorf("%s: cannot write in its folder %s (%v): a database needs a writable folder for its -wal, -shm and -reserve files: keep it in one", path, dir, aerr)
	}
	if aerr := syscall.Access(path, 2 /* W_OK */); aerr != nil && !errors.Is(aerr, fs.ErrNotExist) {
		return fmt.Errorf("%s is read-only (%v): make it writable (chmod u+w), or copy it", path, aerr)
	}
	switch se.Code {
	case sqlite3.ErrNotADB:
		return fmt.Errorf("%s is not a SQLite database: choose a vramscope database, or a new file name to make one", path)
	case sqlite3.ErrBusy, sqlite3.ErrLocked:
		return fmt.Errorf("%s is locked: opening it waited %.1f s for its write lock, %s, which another process held (a vramscope import or trace into the same file?): try again when it ends, or choose another database file",
			path, waited.Seconds(), doing)
	}
	return fmt.Errorf("%s: %w", path, err)
}

// enableAutoVacuum turns incremental auto_vacuum on for a database made
// without it. That takes a VACUUM, which rewrites the whole file: done
// only when the disk has clearly room for a second copy.
func (b *sqliteBackend) enableAutoVacuum(w *sql.DB) {
	var mode, pages, size int64
	if w.QueryRow("PRAGMA auto_vacuum").Scan(&mode) != nil || mode == autoVacuumIncremental {
		return
	}
	if w.QueryRow("PRAGMA page_count").Scan(&pages) != nil || w.QueryRow("PRAGMA page_size").Scan(&size) != nil {
		return
	}
	if free, err := freeSpace(b.path); err != nil || free < uint64(3*pages*size)+4*reserveSize {
		return
	}
	if _, err := w.Exec("PRAGMA auto_vacuum = INCREMENTAL"); err == nil {
		w.Exec("VACUUM")
	}
}

// One writer connection with BEGIN IMMEDIATE: every write transaction is
// already alone.
func (b *sqliteBackend) lockTx(*sql.Tx, string) error { return nil }

func (b *sqliteBackend) readOptions() *sql.TxOptions { return &sql.TxOptions{ReadOnly: true} }

// alive: a process of this machine (SQLite files are not shared between
// machines) that still runs.
func (b *sqliteBackend) alive(pid int64) bool {
	err := syscall.Kill(int(pid), 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// Only one process serves a SQLite file: its viewers hear from its own
// ingest streams.
func (b *sqliteBackend) notify(*sql.Tx, TraceChange) error { return nil }

// One writer: a row read by it is taken.
// clock: the one machine's (SQLite files are not shared between machines).
func (b *sqliteBackend) clock(querier) (time.Time, error) { return machineClock(), nil }

// machineClock is this machine's clock (a variable: tests set it wrong).
var machineClock = time.Now

func (b *sqliteBackend) skipLocked() string { return "" }

func (b *sqliteBackend) deleteKey(table string) string {
	if key, ok := withoutRowid[table]; ok {
		return key
	}
	return "rowid"
}

func (b *sqliteBackend) close() error { return nil }

// migrateSQLite applies the embedded migrations the database lacks, each in its
// own transaction, recording the version in PRAGMA user_version.
func migrateSQLite(db *sql.DB) error {
	steps, err := migrationFiles(migrations.FS)
	if err != nil {
		return err
	}
	latest := 0
	if len(steps) > 0 {
		latest = steps[len(steps)-1].version
	}
	var cur int
	if err := db.QueryRow("PRAGMA user_version").Scan(&cur); err != nil || cur == latest {
		return err
	}
	for _, s := range steps {
		if err := applySQLiteStep(db, s, latest); err != nil {
			return err
		}
	}
	return nil
}

// checkVersion refuses a database at schema version cur that this
// vramscope (at latest) cannot use: a newer one, or another program's.
func checkVersion(q querier, cur, latest int) error {
	if cur > latest {
		return fmt.Errorf("database schema version %d is newer than this vramscope's %d; use a newer vramscope", cur, latest)
	}
	if cur == 0 {
		// A database of another program: vramscope's tables are not added to it.
		var other string
		if err := q.QueryRow("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' LIMIT 1").Scan(&other); err == nil {
			return fmt.Errorf("a SQLite database of another program (it has a table %q and no vramscope schema): choose a vramscope database, or a new file name to make one", other)
		} else if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	return nil
}

// applySQLiteStep applies step s unless the database has it. It looks
// (and checks the database is vramscope's) under the write lock the
// transaction takes (_txlock=immediate), so processes opening a new file
// at once apply each step once and none takes another's tables for
// another program's.
func applySQLiteStep(db *sql.DB, s migrationStep, latest int) error {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var cur int
	if err := tx.QueryRow("PRAGMA user_version").Scan(&cur); err != nil {
		return err
	}
	if err := checkVersion(tx, cur, latest); err != nil || cur >= s.version {
		return err
	}
	body, err := fs.ReadFile(migrations.FS, s.name)
	if err == nil {
		_, err = tx.Exec(string(body))
	}
	if err == nil {
		_, err = tx.Exec(fmt.Sprintf("PRAGMA user_version = %d", s.version))
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		return fmt.Errorf("migration %s: %w", s.name, err)
	}
	return nil
}
