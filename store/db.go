// Package store keeps traces in SQLite: events, stacks, layout checkpoints,
// a usage pyramid and allocation intervals, written by one goroutine and read
// by a pool, so that every question the viewer asks costs about what the
// screen shows, not what the trace holds.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/mattn/go-sqlite3" // registers the "sqlite3" driver

	"vramscope/gpu"
	"vramscope/migrations"
)

// ErrNotFound is returned (possibly wrapped) for an unknown trace, stack,
// allocation or sequence number.
var ErrNotFound = errors.New("not found")

// DB is an open database: one writer connection owned by one goroutine, and a
// pool of read-only connections.
type DB struct {
	path string
	w    *sql.DB // one connection, used only by the writer goroutine
	r    *sql.DB // read-only pool
	jobs chan job
	done chan struct{}

	closeOnce sync.Once
}

// job is one write transaction run by the writer goroutine, or (raw) a
// statement that must run outside a transaction.
type job struct {
	fn    func(tx *sql.Tx) error
	raw   func(c *sql.DB) error
	reply chan error // nil: fire and forget, errors go to fail
	fail  func(error)
}

func dsn(path string, params string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + params
}

// Open opens (creating if needed) the database at path, brings its schema up
// to date and finishes what a process that died left: its live traces are
// marked incomplete, its unfinished imports and deletes removed. Opening
// needs no free space: on a full disk it gives up the reserve, and tidying
// is left for a later open if even that is not enough.
func Open(path string) (*DB, error) {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	// auto_vacuum takes effect on a new database only; older ones are
	// converted by enableAutoVacuum when there is room.
	w, err := sql.Open("sqlite3", dsn(path, "_journal_mode=WAL&_synchronous=NORMAL&_busy_timeout=5000&_txlock=immediate&_auto_vacuum=incremental"))
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
	db := &DB{path: path, w: w, r: r, jobs: make(chan job, 4), done: make(chan struct{})}
	if err := db.roomy(func() error { return migrate(w) }); err != nil {
		w.Close()
		r.Close()
		return nil, openError(path, err)
	}
	db.enableAutoVacuum()
	go db.writeLoop()
	if err := db.tidy(); err != nil && !errors.Is(err, ErrDiskFull) {
		db.Close()
		return nil, openError(path, err)
	}
	db.takeReserve()
	return db, nil
}

// openError says what is wrong with the database at path, and what to do,
// where SQLite's words ("unable to open database file: no such file or
// directory" for a read-only folder) do not.
func openError(path string, err error) error {
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
		return fmt.Errorf("%s is locked: another process has been writing to it for over 5 s (a vramscope import or trace into the same file?): try again when it ends, or choose another database file", path)
	}
	return fmt.Errorf("%s: %w", path, err)
}

// enableAutoVacuum turns incremental auto_vacuum on for a database made
// without it. That takes a VACUUM, which rewrites the whole file: done
// only when the disk has clearly room for a second copy.
func (db *DB) enableAutoVacuum() {
	var mode, pages, size int64
	if db.w.QueryRow("PRAGMA auto_vacuum").Scan(&mode) != nil || mode == autoVacuumIncremental {
		return
	}
	if db.w.QueryRow("PRAGMA page_count").Scan(&pages) != nil || db.w.QueryRow("PRAGMA page_size").Scan(&size) != nil {
		return
	}
	if free, err := freeSpace(db.path); err != nil || free < uint64(3*pages*size)+4*reserveSize {
		return
	}
	if _, err := db.w.Exec("PRAGMA auto_vacuum = INCREMENTAL"); err == nil {
		db.w.Exec("VACUUM")
	}
}

// Path is the database file's absolute path.
func (db *DB) Path() string { return db.path }

// Close waits for pending writes and closes the database. Writers still open
// are left live; the next Open marks their traces incomplete.
func (db *DB) Close() error {
	var err error
	db.closeOnce.Do(func() {
		close(db.jobs)
		<-db.done
		err = errors.Join(db.w.Close(), db.r.Close())
	})
	return err
}

func (db *DB) writeLoop() {
	defer close(db.done)
	for j := range db.jobs {
		var err error
		if j.raw != nil {
			err = full(j.raw(db.w))
		} else {
			err = db.runTx(j.fn)
		}
		if j.reply != nil {
			j.reply <- err
		} else if err != nil && j.fail != nil {
			j.fail(err)
		}
	}
}

func (db *DB) runTx(fn func(tx *sql.Tx) error) error {
	tx, err := db.w.BeginTx(context.Background(), nil)
	if err != nil {
		return full(err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return full(err)
	}
	return full(tx.Commit())
}

// direct runs fn on the writer's connection, outside a transaction, on the
// writer goroutine, and waits for it.
func (db *DB) direct(fn func(c *sql.DB) error) error { return db.wait(job{raw: fn}) }

// write runs fn in a transaction on the writer goroutine and waits for it.
func (db *DB) write(fn func(tx *sql.Tx) error) error { return db.wait(job{fn: fn}) }

// wait queues j and waits for its error.
func (db *DB) wait(j job) error {
	reply := make(chan error, 1)
	j.reply = reply
	if err := db.queue(j); err != nil {
		return err
	}
	return <-reply
}

// writeAsync queues fn; fail gets its error.
func (db *DB) writeAsync(fn func(tx *sql.Tx) error, fail func(error)) error {
	return db.queue(job{fn: fn, fail: fail})
}

// queue hands j to the writer goroutine; after Close it says so.
func (db *DB) queue(j job) (err error) {
	defer func() {
		if recover() != nil {
			err = errors.New("store: database is closed")
		}
	}()
	db.jobs <- j
	return nil
}

// migrate applies the embedded migrations the database lacks, each in its own
// transaction, recording the version in PRAGMA user_version.
func migrate(db *sql.DB) error {
	var cur int
	if err := db.QueryRow("PRAGMA user_version").Scan(&cur); err != nil {
		return err
	}
	steps, err := migrationFiles()
	if err != nil {
		return err
	}
	latest := 0
	if len(steps) > 0 {
		latest = steps[len(steps)-1].version
	}
	if cur > latest {
		return fmt.Errorf("database schema version %d is newer than this vramscope's %d; use a newer vramscope", cur, latest)
	}
	if cur == 0 {
		// A database of another program: vramscope's tables are not added to it.
		var other string
		if err := db.QueryRow("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' LIMIT 1").Scan(&other); err == nil {
			return fmt.Errorf("a SQLite database of another program (it has a table %q and no vramscope schema): choose a vramscope database, or a new file name to make one", other)
		} else if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	for _, s := range steps {
		if s.version <= cur {
			continue
		}
		body, err := fs.ReadFile(migrations.FS, s.name)
		if err != nil {
			return err
		}
		tx, err := db.Begin()
		if err != nil {
			return err
		}
		if _, err := tx.Exec(string(body)); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %s: %w", s.name, err)
		}
		if _, err := tx.Exec(fmt.Sprintf("PRAGMA user_version = %d", s.version)); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %s: %w", s.name, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migration %s: %w", s.name, err)
		}
	}
	return nil
}

type migrationStep struct {
	version int
	name    string
}

// migrationFiles lists NNNN_name.sql files in version order, refusing gaps
// and duplicates so a misnumbered file fails every test at once.
func migrationFiles() ([]migrationStep, error) {
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		return nil, err
	}
	var steps []migrationStep
	for _, n := range names {
		num, _, ok := strings.Cut(path.Base(n), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name is not NNNN_name.sql", n)
		}
		steps = append(steps, migrationStep{v, n})
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i].version < steps[j].version })
	for i, s := range steps {
		if s.version != i+1 {
			return nil, fmt.Errorf("migration %s: expected version %d", s.name, i+1)
		}
	}
	return steps, nil
}

// Traces being written by a Writer of this process, by tid per database path;
// any other live trace whose owner is this process is left from an earlier,
// unclosed handle.
var (
	liveMu     sync.Mutex
	liveTraces = map[string]bool{}
)

func liveKey(path string, tid int64) string { return path + "\x00" + strconv.FormatInt(tid, 10) }

// tidy finishes what processes that died (or handles closed unfinished)
// left: their live traces are marked incomplete, their imports removed,
// and deletes that did not end are taken to the end.
func (db *DB) tidy() error {
	var deleting []int64
	err := db.roomy(func() error {
		deleting = deleting[:0]
		return db.write(func(tx *sql.Tx) error {
			rows, err := tx.Query("SELECT tid, owner_pid, status FROM traces WHERE status IN (?, ?, ?)",
				string(gpu.StatusLive), statusImporting, statusDeleting)
			if err != nil {
				return err
			}
			type owned struct {
				tid, pid int64
				status   string
			}
			var all []owned
			for rows.Next() {
				var o owned
				if err := rows.Scan(&o.tid, &o.pid, &o.status); err != nil {
					rows.Close()
					return err
				}
				all = append(all, o)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			for _, o := range all {
				switch {
				case o.status == statusDeleting:
					deleting = append(deleting, o.tid)
				case processAlive(db.path, o.tid, int(o.pid)):
				case o.status == statusImporting:
					if _, err := tx.Exec("UPDATE traces SET status = ? WHERE tid = ?", statusDeleting, o.tid); err != nil {
						return err
					}
					deleting = append(deleting, o.tid)
				default:
					if _, err := tx.Exec("UPDATE traces SET status = ? WHERE tid = ?", string(gpu.StatusIncomplete), o.tid); err != nil {
						return err
					}
				}
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	for _, tid := range deleting {
		if err := db.remove(tid); err != nil {
			return err
		}
	}
	return nil
}

func processAlive(path string, tid int64, pid int) bool {
	if pid == os.Getpid() {
		liveMu.Lock()
		defer liveMu.Unlock()
		return liveTraces[liveKey(path, tid)]
	}
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
