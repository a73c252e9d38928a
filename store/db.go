// Package store keeps traces in a database: events, stacks, layout
// checkpoints, a usage pyramid and allocation intervals, written by one
// goroutine and read by a pool, so that every question the viewer asks
// costs about what the screen shows, not what the trace holds. The
// database is a SQLite file (the embedded default) or a PostgreSQL
// database that several servers share (backend.go); no other package
// knows which.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"

	"vramscope/gpu"
)

// ErrNotFound is returned (possibly wrapped) for an unknown trace, stack,
// allocation or sequence number.
var ErrNotFound = errors.New("not found")

// DB is an open database: one writer connection owned by one goroutine, and a
// pool of read connections. What differs between SQLite and PostgreSQL is
// behind be; nothing outside this package knows which one it talks to.
type DB struct {
	path string // the SQLite file, or the PostgreSQL address without password
	be   backend
	// owner is what owner_pid holds for what this handle writes: the
	// process id on SQLite, this server's session on PostgreSQL.
	owner int64
	w     *sql.DB // one connection, used only by the writer goroutine
	r     *sql.DB // read pool
	jobs  chan job
	done  chan struct{}
	watch watchers
	// pools keeps PoolSegments' answers (poolsKey → []PoolSegment),
	// labels the stacks' labels the bands read (labelKey → string).
	pools, labels sync.Map

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

// IsPostgres says whether a --db value names a PostgreSQL database
// (postgres://... or postgresql://...) rather than a SQLite file.
func IsPostgres(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// Open opens the database db names: a PostgreSQL address
// (postgres://user@host/dbname), or a SQLite file, made if missing. Its
// schema is brought up to date and what a writer that died left is
// finished: its live traces are marked incomplete, its unfinished imports
// and deletes removed.
func Open(db string) (*DB, error) {
	if IsPostgres(db) {
		return openPostgres(db)
	}
	return openSQLite(db)
}

// start runs the writer goroutine and tidies what dead writers left.
func (db *DB) start() error {
	go db.writeLoop()
	if err := db.tidy(); err != nil && !errors.Is(err, ErrDiskFull) {
		db.Close()
		return err
	}
	db.be.takeReserve()
	return nil
}

// Path is the SQLite database file's absolute path, or the PostgreSQL
// address without its password.
func (db *DB) Path() string { return db.path }

// Close waits for pending writes and closes the database. Writers still open
// are left live; the next Open marks their traces incomplete.
func (db *DB) Close() error {
	var err error
	db.closeOnce.Do(func() {
		close(db.jobs)
		<-db.done
		err = errors.Join(db.be.close(), db.w.Close(), db.r.Close())
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

type migrationStep struct {
	version int
	name    string
}

// migrationFiles lists NNNN_name.sql files in version order, refusing gaps
// and duplicates so a misnumbered file fails every test at once.
func migrationFiles(fsys fs.FS) ([]migrationStep, error) {
	names, err := fs.Glob(fsys, "*.sql")
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
			if err := db.be.lockTx(tx, "tidy"); err != nil {
				return err
			}
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
				case db.alive(o.tid, o.pid):
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

// alive says whether owner, which wrote trace tid live, still writes it:
// this handle's own traces are known here; another process's or server's
// the backend answers.
func (db *DB) alive(tid, owner int64) bool {
	if owner == db.owner {
		liveMu.Lock()
		defer liveMu.Unlock()
		return liveTraces[liveKey(db.path, tid)]
	}
	return owner > 0 && db.be.alive(owner)
}
