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

	_ "github.com/mattn/go-sqlite3" // registers the "sqlite3" driver

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

// job is one write transaction run by the writer goroutine.
type job struct {
	fn    func(tx *sql.Tx) error
	reply chan error // nil: fire and forget, errors go to fail
	fail  func(error)
}

func dsn(path string, params string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + params
}

// Open opens (creating if needed) the database at path, brings its schema up
// to date and marks live traces whose writing process is gone incomplete.
func Open(path string) (*DB, error) {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	w, err := sql.Open("sqlite3", dsn(path, "_journal_mode=WAL&_synchronous=NORMAL&_busy_timeout=5000&_txlock=immediate"))
	if err != nil {
		return nil, err
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	if err := migrate(w); err != nil {
		w.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r, err := sql.Open("sqlite3", dsn(path, "mode=ro&_busy_timeout=5000"))
	if err != nil {
		w.Close()
		return nil, err
	}
	r.SetMaxOpenConns(max(4, runtime.NumCPU()))
	r.SetMaxIdleConns(max(4, runtime.NumCPU()))
	db := &DB{path: path, w: w, r: r, jobs: make(chan job, 4), done: make(chan struct{})}
	if err := db.markAbandoned(); err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	go db.writeLoop()
	return db, nil
}

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
		err := db.runTx(j.fn)
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
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// write runs fn in a transaction on the writer goroutine and waits for it.
func (db *DB) write(fn func(tx *sql.Tx) error) (err error) {
	defer func() {
		if recover() != nil {
			err = errors.New("store: database is closed")
		}
	}()
	reply := make(chan error, 1)
	db.jobs <- job{fn: fn, reply: reply}
	return <-reply
}

// writeAsync queues fn; fail gets its error.
func (db *DB) writeAsync(fn func(tx *sql.Tx) error, fail func(error)) (err error) {
	defer func() {
		if recover() != nil {
			err = errors.New("store: database is closed")
		}
	}()
	db.jobs <- job{fn: fn, fail: fail}
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

// markAbandoned marks incomplete the live traces whose writing process has
// gone (killed, crashed, or closed without finishing them).
func (db *DB) markAbandoned() error {
	rows, err := db.w.Query("SELECT tid, owner_pid FROM traces WHERE status = ?", string(gpu.StatusLive))
	if err != nil {
		return err
	}
	var dead []int64
	for rows.Next() {
		var tid, pid int64
		if err := rows.Scan(&tid, &pid); err != nil {
			rows.Close()
			return err
		}
		if !processAlive(db.path, tid, int(pid)) {
			dead = append(dead, tid)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, tid := range dead {
		if _, err := db.w.Exec("UPDATE traces SET status = ? WHERE tid = ? AND status = ?", string(gpu.StatusIncomplete), tid, string(gpu.StatusLive)); err != nil {
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
